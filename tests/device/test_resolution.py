"""Device and precision resolution, and what a Device does for its kind, with CUDA and MPS
monkeypatched (this machine has neither)."""

import pytest
import torch

from buildllm.cli import main
from buildllm.device import available as runtime
from buildllm.device import cpu_bf16
from buildllm.device import device as device_module
from buildllm.device import precision as precision_mod
from buildllm.device.device import Device
from buildllm.device.peak_flops import datasheet_peak
from buildllm.device.precision import tunable_precisions
from buildllm.errors import DeviceUnavailable
from buildllm.plan.device import resolve_device
from buildllm.plan.precision import resolve_precision


@pytest.fixture
def fake_cuda(monkeypatch):
    """A machine with `count` GPUs of compute capability `capability`."""

    def install(count=1, capability=(8, 0), name="NVIDIA A100"):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: name)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: capability)

    return install


def test_auto_prefers_cuda_then_mps_then_cpu(fake_cuda, monkeypatch):
    monkeypatch.setattr(runtime, "mps_available", lambda: True)
    fake_cuda(count=1)
    assert resolve_device("auto").device == "cuda:0"
    fake_cuda(count=0)
    decision = resolve_device("auto")
    assert decision.device == "mps" and "MPS is available" in decision.reason
    monkeypatch.setattr(runtime, "mps_available", lambda: False)
    decision = resolve_device("auto")
    assert decision.device == "cpu" and "no CUDA" in decision.reason and "no Apple MPS" in decision.reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_explicit_cuda_without_cuda_fails_with_advice():
    with pytest.raises(DeviceUnavailable, match="CUDA is not available.*use --device cpu"):
        resolve_device("cuda")


def test_cuda_index_beyond_count_fails(fake_cuda):
    fake_cuda(count=1)
    with pytest.raises(DeviceUnavailable, match=r"cuda:3 requested but this machine has 1 CUDA device"):
        resolve_device("cuda:3")
    assert resolve_device("cuda:0").device == "cuda:0"


def test_mps_and_xla_missing_fail(monkeypatch):
    monkeypatch.setattr(runtime, "mps_available", lambda: False)
    with pytest.raises(DeviceUnavailable, match="Apple MPS is not available"):
        resolve_device("mps")
    monkeypatch.setattr(runtime, "xla_available", lambda: False)
    with pytest.raises(DeviceUnavailable, match="torch_xla is not installed"):
        resolve_device("xla")


def test_no_cuda_reason_distinguishes_cpu_build_from_missing_driver(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "CPU-only build" in runtime.why_no_cuda()
    monkeypatch.setattr(torch.version, "cuda", "12.6")
    assert "no usable NVIDIA GPU or driver" in runtime.why_no_cuda()


CPU = Device("cpu", "cpu", "cpu", "test")
CUDA = Device("cuda", "cuda:0", "cuda", "test")
MPS = Device("mps", "mps", "mps", "test")


def test_auto_precision_on_ampere_is_bf16_with_tf32(fake_cuda):
    fake_cuda(capability=(9, 0), name="NVIDIA H200")
    decision = resolve_precision("auto", CUDA)
    assert decision.precision == "bf16" and not decision.grad_scaler
    assert decision.tf32_enabled and decision.tensor_cores_enabled


def test_auto_precision_before_ampere_is_fp16_with_scaler(fake_cuda):
    fake_cuda(capability=(7, 5), name="Tesla T4")
    decision = resolve_precision("auto", CUDA)
    assert decision.precision == "fp16" and decision.grad_scaler
    assert not decision.tf32_enabled and decision.tensor_cores_enabled
    assert "no bf16" in decision.reason


def test_explicit_bf16_on_old_gpu_fails_with_advice(fake_cuda):
    fake_cuda(capability=(7, 0), name="Tesla V100")
    with pytest.raises(
        DeviceUnavailable, match=r"Tesla V100 .*no bf16.*use --precision fp16 \(gradient scaling\) or fp32"
    ):
        resolve_precision("bf16", CUDA)


def test_cpu_precisions(cpu_with_bf16):
    assert resolve_precision("auto", CPU).precision == "fp32"
    bf16 = resolve_precision("bf16", CPU)
    assert bf16.precision == "bf16" and bf16.autocast_dtype == torch.bfloat16 and "autocast" in bf16.reason
    assert tunable_precisions(CPU) == ["fp32", "bf16"]
    with pytest.raises(DeviceUnavailable, match="fp16 requested on the CPU.*--precision bf16"):
        resolve_precision("fp16", CPU)


def test_bf16_is_refused_on_a_cpu_without_a_bf16_matmul_path(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "native_bf16", lambda: False)
    with pytest.raises(DeviceUnavailable, match="no bf16 matmul path.*use --precision fp32") as refused:
        resolve_precision("bf16", CPU)
    assert "\n" not in str(refused.value)
    assert resolve_precision("auto", CPU).precision == "fp32" and tunable_precisions(CPU) == ["fp32"]


def test_this_cpu_refuses_bf16_exactly_when_it_has_no_bf16_matmul_path(workdir, capsys):
    """On this machine, for real: the command line plans bf16, or refuses it in one line and writes nothing."""
    code = main(["dry-run", "--preset", "tiny", "--device", "cpu", "--precision", "bf16"])
    err = capsys.readouterr().err
    if cpu_bf16.native_bf16():
        assert code == 0, err
    else:
        assert code == 2 and err.count("\n") == 1 and "no bf16 matmul path" in err
        assert not (workdir / "metrics" / "dry_run.json").exists()


def test_profile_default_applies_only_to_auto(fake_cuda):
    fake_cuda(capability=(8, 6))
    assert resolve_precision("auto", CUDA, profile_default="fp32").precision == "fp32"
    assert resolve_precision("fp16", CUDA, profile_default="fp32").precision == "fp16"


def test_mps_auto_is_fp32_with_reason():
    decision = resolve_precision("auto", MPS)
    assert decision.precision == "fp32" and "MPS" in decision.reason
    assert not decision.tf32_enabled and not decision.grad_scaler


def test_matmul_settings_follow_tf32(monkeypatch, fake_cuda):
    fake_cuda(capability=(8, 0))
    seen = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", seen.append)
    precision_mod.apply_matmul_settings(resolve_precision("auto", CUDA))
    assert seen == ["high"]
    fake_cuda(capability=(7, 5))
    precision_mod.apply_matmul_settings(resolve_precision("fp32", CUDA))
    assert seen == ["high"]  # no TF32 before Ampere: nothing changed


# What a Device does for its kind: the right GPU of several, and nothing CUDA-only elsewhere.


def test_cuda_device_synchronizes_and_measures_its_own_index(fake_cuda, monkeypatch):
    fake_cuda(count=2)
    seen = []
    for name in (
        "synchronize",
        "reset_peak_memory_stats",
        "memory_allocated",
        "max_memory_allocated",
        "max_memory_reserved",
        "memory_reserved",
    ):
        monkeypatch.setattr(torch.cuda, name, lambda index=None, name=name: seen.append((name, index)) or 2**20)
    second = Device("cuda:1", "cuda:1", "cuda", "test")
    probe = second.peak_memory()
    figures = probe.read()
    assert figures["peak_memory_allocated_bytes"] == 2**20 and figures["peak_memory_method"].startswith("cuda")
    second.timed()
    assert seen and {index for _, index in seen} == {1}, seen
    assert ("synchronize", 1) in seen


def test_oom_figures_come_from_the_devices_own_gpu(fake_cuda, monkeypatch):
    fake_cuda(count=2)
    asked = []
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda index=None: asked.append(index) or 7)

    class Properties:
        total_memory = 80 * 2**30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: asked.append(index) or Properties)
    figures = Device("cuda:1", "cuda:1", "cuda", "test").oom_figures()
    assert figures == {
        "oom_allocated_bytes": 7,
        "oom_reserved_bytes": 7,
        "oom_peak_allocated_bytes": 7,
        "oom_device_total_bytes": 80 * 2**30,
    }
    assert set(asked) == {1}
    assert MPS.oom_figures() == {}
    # The CPU's figures are the process's own: what it held and what was still free for it.
    cpu = CPU.oom_figures()
    assert set(cpu) == {"oom_resident_bytes", "oom_free_bytes"} and cpu["oom_resident_bytes"] > 0


def test_peak_flops_reads_the_table_for_the_devices_own_gpu(monkeypatch):
    names = {0: "NVIDIA A100-SXM4-80GB", 1: "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: names[index])
    peak = datasheet_peak(Device("cuda:1", "cuda:1", "cuda", "test"), "bf16", tf32=True)
    assert peak.flops == 989.4e12 and "H100" in peak.source


def test_cpu_device_ignores_pinning_and_keeps_its_own_defaults():
    x, y = CPU.put_pair(torch.stack((torch.ones(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))))
    assert x.device.type == "cpu" and x.sum() == 6 and y.sum() == 0 and not x.is_pinned()
    assert x.is_contiguous() and y.is_contiguous()
    assert CUDA.worker_context == "forkserver" and CPU.worker_context is None
    assert (CPU.runtime_defaults, CUDA.runtime_defaults, MPS.runtime_defaults) == ("cpu", "gpu", "gpu")
    assert CPU.threads_apply and not CUDA.threads_apply and not MPS.threads_apply
    assert CPU.host_memory and not CUDA.host_memory and not MPS.host_memory
    assert CUDA.pin_memory and not CPU.pin_memory and not MPS.pin_memory
    assert MPS.materialises_attention and not CUDA.materialises_attention and not CPU.materialises_attention
    assert (CPU.autocast_type, CUDA.autocast_type) == ("cpu", "cuda")


def test_each_rank_gets_its_own_gpu_and_mps_refuses_torchrun(fake_cuda, monkeypatch):
    fake_cuda(count=2)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    rank = CUDA.for_rank(1, rank=3, size=4)
    assert rank.device == "cuda:1" and rank.index == 1 and chosen == [1] and "rank 3 of 4" in rank.reason
    assert rank.collective_backend == "nccl" and rank.collective_device == "cuda:1" and rank.ddp_device_ids == [1]
    with pytest.raises(DeviceUnavailable, match="has 2 CUDA device"):
        CUDA.for_rank(2, rank=2, size=3, local_size="3")
    assert CPU.for_rank(1, rank=1, size=2) is CPU and CPU.collective_backend == "gloo" and CPU.ddp_device_ids is None
    with pytest.raises(DeviceUnavailable, match="supports cuda and cpu, not mps"):
        MPS.for_rank(0, rank=0, size=2)


def test_the_environment_record_describes_the_device_it_is_given():
    from buildllm.device.hardware import environment

    info = environment(Device("cpu", "cpu", "cpu", "chosen upstream"))
    assert info["resolved_device"] == "cpu" and info["device_reason"] == "chosen upstream"


def test_host_free_memory_reads_no_ulimit_where_there_is_no_resource_module(monkeypatch):
    """Windows has no `resource` module: the host's available memory (and a cgroup's) answer alone."""
    monkeypatch.setattr(device_module, "resource", None)
    free, source = device_module.host_free_memory()
    assert free > 0 and "ulimit" not in source
