"""The one GPU lister: its parsers over real tool output shapes, and the host's own listing."""

from kit.adapters.gpus import NONE_FOUND, Gpu, list_gpus, parse_nvidia_smi, parse_rocm_smi


def test_nvidia_smi_rows_become_records():
    text = "0, NVIDIA H200, 143771, 570.86.15, GPU-1b2c, 9.0\n1, NVIDIA H200, 143771, 570.86.15, GPU-3d4e, 9.0\n"
    gpus = parse_nvidia_smi(text)
    assert gpus[1] == Gpu("nvidia", 1, "NVIDIA H200", "570.86.15", "GPU-3d4e", 143771, "9.0")


def test_nvidia_smi_without_compute_cap_and_bad_rows():
    fields = ("index", "name", "memory.total", "driver_version", "uuid")
    assert parse_nvidia_smi("0, A100, 40960, 470.1, GPU-x\nnot, a, row, at, all\n", fields) == [
        Gpu("nvidia", 0, "A100", "470.1", "GPU-x", 40960, "")]


def test_rocm_smi_json_cards():
    text = ('{"card0": {"Card series": "AMD Instinct MI300X", "Unique ID": "0x1"}, '
            '"system": {"Driver version": "6.8.5"}}')
    assert parse_rocm_smi(text) == [Gpu("amd", 0, "AMD Instinct MI300X", "6.8.5", "0x1")]
    assert parse_rocm_smi("not json") == []


def test_this_host_lists_consistently():
    listing = list_gpus()
    assert (listing.source == NONE_FOUND) == (not listing.devices) or listing.source != NONE_FOUND
    assert all(g.vendor in ("nvidia", "amd") for g in listing.devices)
