"""HAMi's pod device annotation (``hami.io/vgpu-devices-allocated``) decoded as HAMi v2.10.0's
scheduler does (pkg/device/devices.go DecodePodDevices, initContainer.go
CollapseInitContainerUsage): what a pod Camp did not create holds on each card."""

from __future__ import annotations

import pytest

from scheduling.backends.kubernetes import (
    DeviceAnnotationError,
    decode_pod_devices,
    init_containers_succeeded,
    pod_device_usage,
)


def test_containers_split_on_semicolons_devices_on_colons() -> None:
    value = "GPU-a,NVIDIA,20000,25:GPU-b,NVIDIA,1000,10:;;GPU-a,NVIDIA,5000,5:;"
    assert decode_pod_devices(value) == [
        [("GPU-a", "NVIDIA", 20000, 25), ("GPU-b", "NVIDIA", 1000, 10)],
        [],  # a container without devices keeps its index (HAMi: "do NOT skip empty")
        [("GPU-a", "NVIDIA", 5000, 5)],
        [],
    ]
    # What Camp itself writes decodes to what it meant (one container, trailing ':').
    assert decode_pod_devices("GPU-a,NVIDIA,20000,25:") == [[("GPU-a", "NVIDIA", 20000, 25)]]
    # HAMi skips entries without a comma, and takes only the first four fields.
    assert decode_pod_devices("junk:GPU-a,NVIDIA,1,2,extra:") == [[("GPU-a", "NVIDIA", 1, 2)]]


def test_app_containers_add_up_and_init_containers_count_their_peak() -> None:
    value = "GPU-a,NVIDIA,30000,50:;GPU-a,NVIDIA,10000,20:;GPU-a,NVIDIA,4000,10:GPU-b,NVIDIA,8000,30:;"
    # Two init containers (run one after the other: the peak, one slot), one app container.
    assert pod_device_usage(value, init_containers=2) == {
        "GPU-a": (30000, 50, 1),  # max(init peak 30000/50, app 4000/10)
        "GPU-b": (8000, 30, 1),
    }
    # No init containers: all three run together, each a sharer slot.
    assert pod_device_usage(value) == {"GPU-a": (44000, 80, 3), "GPU-b": (8000, 30, 1)}
    assert pod_device_usage("") == {}


@pytest.mark.parametrize("value, says", [
    ("GPU-a,NVIDIA,20000:", "missing fields"),
    ("GPU-a,NVIDIA,lots,25:", "invalid memory field 'lots'"),
    ("GPU-a,NVIDIA,20000,25%:", "invalid core field '25%'"),
    ("GPU-a,NVIDIA, 20000,25:", "invalid memory field"),
    ("GPU-a,NVIDIA,1_000,25:", "invalid memory field"),
    ("GPU-a,NVIDIA,4294967296,25:", "invalid memory field"),  # beyond Go's int32
])
def test_what_hami_cannot_decode_is_an_error_naming_the_field(value: str, says: str) -> None:
    with pytest.raises(DeviceAnnotationError, match=says.replace("(", r"\(")):
        pod_device_usage(value)


def test_once_init_containers_succeeded_only_app_containers_count() -> None:
    """HAMi's scheduler shrinks a pod's usage to its app containers once every init container
    has terminated with exit code 0 (onUpdatePod, AppContainersOnlyDeviceUsage): a card only
    the init containers used is free again, slots are the app containers on it."""
    value = "GPU-a,NVIDIA,30000,50:;GPU-c,NVIDIA,10000,20:;GPU-a,NVIDIA,4000,10:GPU-b,NVIDIA,8000,30:;"
    assert pod_device_usage(value, init_containers=2, init_done=True) == {
        "GPU-a": (4000, 10, 1), "GPU-b": (8000, 30, 1)}


def _pod_status(*codes: int | None) -> dict[str, object]:
    return {"initContainerStatuses": [
        {"name": f"i{n}", "state": {"terminated": {"exitCode": c}} if c is not None else {"running": {}}}
        for n, c in enumerate(codes)]}


def test_init_containers_are_done_only_when_all_succeeded() -> None:
    assert init_containers_succeeded(_pod_status(0, 0))
    assert not init_containers_succeeded(_pod_status(0, 1))
    assert not init_containers_succeeded(_pod_status(0, None))
    assert not init_containers_succeeded({})  # no statuses yet: HAMi does not shrink either
