"""The one container option set: what every container the kit starts gets, per platform."""

from kit.adapters.docker import container_options, image_age_key, ref_of


def test_gpu_platforms_share_the_host_ipc_and_are_never_privileged():
    cuda, rocm, cpu = (container_options(p) for p in ("cuda", "rocm", "cpu"))
    assert cuda["device_requests"][0]["Capabilities"] == [["gpu"]] and cuda["ipc_mode"] == "host"
    assert "/dev/kfd:/dev/kfd:rwm" in rocm["devices"] and rocm["ipc_mode"] == "host"
    assert cpu == {"shm_size": "1g", "privileged": False}
    assert not any(o["privileged"] for o in (cuda, rocm, cpu))


def test_ref_prefers_the_first_tag():
    from types import SimpleNamespace

    assert ref_of(SimpleNamespace(tags=["b:2", "a:1"], id="sha256:0")) == "a:1"
    assert ref_of(SimpleNamespace(tags=[], id="sha256:0")) == "sha256:0"
    assert image_age_key(SimpleNamespace(attrs={}, id="sha256:0")) == (0, 0, 0, 0, "sha256:0")


def test_among_images_of_one_creation_time_the_one_tagged_last_is_the_newest():
    # reproducible builds give every image the same creation time: the id must not decide which a run finds
    from types import SimpleNamespace

    epoch = "2026-01-01T00:00:00Z"
    built_last = SimpleNamespace(attrs={"Created": epoch, "Metadata": {"LastTagTime": "2026-12-06T02:39:17.9748Z"}},
                                 id="sha256:" + "2" * 64)
    built_before = SimpleNamespace(attrs={"Created": epoch, "Metadata": {"LastTagTime": "2026-12-06T01:00:00Z"}},
                                   id="sha256:" + "f" * 64)
    never_tagged = SimpleNamespace(attrs={"Created": epoch, "Metadata": {"LastTagTime": "0001-01-01T00:00:00Z"}},
                                   id="sha256:" + "e" * 64)
    assert max([built_before, never_tagged, built_last], key=image_age_key) is built_last
    assert image_age_key(never_tagged) < image_age_key(built_before)
