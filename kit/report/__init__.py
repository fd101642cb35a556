"""The reviewer's page: one self-contained HTML file for a claim's verdict, a comparison or a run."""
