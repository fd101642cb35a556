#!/bin/sh
# Make sure a headless browser is here for the reviewer's page tests (tests/cli/test_claim_workflow.py):
# Debian's chromium, installed with apt when missing (no npm browser download: it fetches from outside).
set -eu
. "$(cd "$(dirname "$0")" && pwd)/lib/install-missing.sh"
install_missing ensure-browser chromium:chromium
