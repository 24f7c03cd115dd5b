"""Role vllm_server: render its unit and environment with real Ansible, check its validation.

Nothing here touches the host: templates render into a temporary directory, and the
validation plays run in check mode against localhost and stop before any change.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import ROOT, role_vars_files, systemd_verify

ROLE = ROOT / "roles" / "vllm_server"


#: What validate.yml's read of a host finds: the stack manifest names the venv the unit must
#: run, and the host package's link its folder (the unit names both, never `current`).
HOST_READ = {
    "read": {"/etc/specfleet/stack.json": '{"venv": "/opt/specfleet/venvs/0123456789abcdef"}'},
    "paths": {"/opt/specfleet/lib/current": {"islink": True, "target": "specfleet-89ab"}},
}


def render(ansible, **extra) -> tuple[str, str]:
    """Render the unit and the environment file with the project's and the role's defaults,
    its vars and its profile's vars (cuda unless ``specfleet_accelerator`` says otherwise),
    on a host whose stack and host package validate.yml read as HOST_READ."""
    extra = {"__vllm_server_host": HOST_READ} | extra
    out = ansible.tmp_path / "out"
    out.mkdir(exist_ok=True)
    play = {
        "name": "Render vllm_server templates",
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": role_vars_files("vllm_server"),
        "tasks": [
            {
                "name": f"Render {name}",
                "ansible.builtin.template": {
                    "src": str(ROLE / "templates" / src),
                    "dest": str(out / name),
                    "mode": "0600",
                },
            }
            for src, name in (("vllm-server.service.j2", "unit"), ("vllm-server.env.j2", "env"))
        ],
    }
    result = ansible.playbook([play], extra)
    assert result.returncode == 0, result.stdout + result.stderr
    return (out / "unit").read_text(), (out / "env").read_text()


def exec_start(unit: str) -> str:
    """ExecStart= with its continuation lines joined."""
    text = unit.replace("\\\n", " ")
    [line] = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    return " ".join(line.split())


# --------------------------------------------------------------------------- unit


def test_unit_with_defaults_cuda(ansible):
    unit, env = render(ansible)
    cmd = exec_start(unit)
    # By the venv's own folder: a switch of `current` never changes what a restart runs.
    assert cmd.startswith(
        "ExecStart=/opt/specfleet/venvs/0123456789abcdef/bin/python -m specfleet.host.serve"
    )
    assert "--model /var/lib/specfleet/models/target" in cmd
    assert "--host 127.0.0.1 --port 8000" in cmd
    assert "--tensor-parallel-size 1" in cmd
    assert "--dtype auto" in cmd
    assert "--gpu-memory-utilization 0.9" in cmd
    assert "--enforce-eager" not in cmd
    assert "--max-model-len" not in cmd and "--served-model-name" not in cmd
    assert (
        '--speculative-config \'{"method":"eagle3","model":"/var/lib/specfleet/drafters/'
        'current","num_speculative_tokens":3}\'' in cmd
    )
    assert "--api-key" not in unit
    for line in (
        "User=specfleet",
        "Group=specfleet",
        "Type=exec",
        "Restart=always",
        "KillMode=mixed",
        "TimeoutStopSec=120",
        "LimitMEMLOCK=infinity",
        "LimitNOFILE=1048576",
        "StartLimitIntervalSec=3600",
        "StartLimitBurst=5",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "StateDirectory=specfleet/vllm",
        "CacheDirectory=specfleet/vllm",
        "WorkingDirectory=/var/lib/specfleet/vllm",
        "Environment=HOME=/var/lib/specfleet/vllm",
        "Environment=PYTHONPATH=/opt/specfleet/lib/specfleet-89ab",
        "ReadOnlyPaths=-/var/lib/specfleet/models/target -/var/lib/specfleet/drafters -/run/lock",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia rw",
        "DeviceAllow=char-nvidiactl rw",
        "DeviceAllow=char-nvidia-frontend rw",
        "DeviceAllow=char-nvidia-uvm rw",
        "DeviceAllow=char-nvidia-caps r",
        "Requires=specfleet-nvidia-devices.service",
        "EnvironmentFile=/etc/specfleet/specfleet-vllm.env",
        "ExecStartPre=/opt/specfleet/venvs/0123456789abcdef/bin/python "
        "/opt/specfleet/bin/vllm-server-shm-clean",
        # A stop ends well inside TimeoutStopSec also while the server starts.
        "ExecStop=/opt/specfleet/venvs/0123456789abcdef/bin/python"
        " /opt/specfleet/bin/vllm-server-stop $MAINPID http://127.0.0.1:8000/health 60",
        "WantedBy=multi-user.target",
    ):
        assert line in unit.splitlines(), line
    assert "PrivateDevices" not in unit
    assert "DeviceAllow=char-nvidia-nvswitch rw" not in unit  # fabric manager's, not vLLM's
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert 'CUDA_DEVICE_ORDER="PCI_BUS_ID"' in env.splitlines()
    assert "CUDA_VISIBLE_DEVICES" not in env  # every GPU by default
    # Ordered after fabric manager (CUDA error 802 before it) and persistenced.
    (after,) = [line for line in unit.splitlines() if line.startswith("After=")]
    assert {"nvidia-persistenced.service", "nvidia-fabricmanager.service"} <= set(
        after.split("=")[1].split()
    )


def test_the_server_gpus_are_its_visible_devices(ansible):
    _, env = render(ansible, specfleet_server_gpus="0,1,2,3")
    assert 'CUDA_VISIBLE_DEVICES="0,1,2,3"' in env.splitlines()
    _, env = render(ansible, specfleet_server_gpus="0,1", specfleet_accelerator="cpu")
    assert "CUDA_VISIBLE_DEVICES" not in env  # no GPUs on the cpu profile


def test_unit_profile_cpu(ansible):
    unit, env = render(ansible, specfleet_accelerator="cpu")
    cmd = exec_start(unit)
    assert "--enforce-eager" in cmd
    assert "--gpu-memory-utilization" not in cmd
    assert "PrivateDevices=yes" in unit.splitlines()
    assert "DeviceAllow" not in unit
    assert 'VLLM_CPU_KVCACHE_SPACE="4"' in env.splitlines()
    assert "Requires=" not in unit


def test_env_file(ansible):
    _, env = render(
        ansible,
        specfleet_server_api_key='s3cr"et\\x',
        vllm_server_environment={"VLLM_LOGGING_LEVEL": "DEBUG"},
    )
    lines = env.splitlines()
    assert "HF_HUB_OFFLINE=1" in lines
    assert "s3cr" not in env  # the key is in its own file, never in the environment
    assert 'VLLM_LOGGING_LEVEL="DEBUG"' in lines


def test_the_key_is_in_its_own_file(ansible):
    unit, env = render(ansible, specfleet_server_api_key="sk-x")
    key_file = "Environment=SPECFLEET_API_KEY_FILE=/etc/specfleet/specfleet-vllm.api-key"
    assert key_file in unit.splitlines()
    assert "sk-x" not in unit and "sk-x" not in env
    unit, _ = render(ansible)
    assert "SPECFLEET_API_KEY_FILE" not in unit


def test_no_api_key_line_without_key(ansible):
    _, env = render(ansible)
    assert "VLLM_API_KEY" not in env


def test_optional_arguments_and_quoting(ansible):
    unit, _ = render(
        ansible,
        vllm_server_served_model_name="tiny llama",
        vllm_server_max_model_len=4096,
        vllm_server_draft_tensor_parallel_size=1,
        specfleet_num_speculative_tokens=5,
        vllm_server_extra_args=[
            "--max-num-seqs",
            "8",
            "--override-generation-config",
            '{"temperature": 0.5}',
            "100%",
        ],
    )
    cmd = exec_start(unit)
    assert "--served-model-name 'tiny llama'" in cmd
    assert "--max-model-len 4096" in cmd
    assert '"draft_tensor_parallel_size":1' in cmd and '"num_speculative_tokens":5' in cmd
    assert "--max-num-seqs 8" in cmd
    assert "--override-generation-config '{\"temperature\": 0.5}'" in cmd
    assert " 100%% " in cmd + " "  # no systemd specifier expansion


def test_speculation_off(ansible):
    unit, _ = render(ansible, vllm_server_speculative_enabled=False)
    assert "--speculative-config" not in unit
    assert "EAGLE-3)" not in unit  # the description says what it serves


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
@pytest.mark.parametrize("accelerator", ["cpu", "cuda"])
def test_systemd_accepts_unit_and_exposure(ansible, tmp_path, accelerator):
    unit, _ = render(ansible, specfleet_accelerator=accelerator)
    needs = ["specfleet-nvidia-devices.service"]  # the nvidia_gpu role installs the real one
    assert systemd_verify(tmp_path, "specfleet-vllm.service", unit, needs) <= 2.0


# --------------------------------------------------------------------------- validation


def _role_play(tasks_from: str | None = None) -> list[dict]:
    include: dict = {"name": "vllm_server"}
    if tasks_from:
        include["tasks_from"] = tasks_from
    return [
        {
            "name": "Run vllm_server",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [{"name": "Include the role", "ansible.builtin.include_role": include}],
        }
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"vllm_server_speculative_method": "eagle"}, "vllm_server_speculative_method"),
        ({"specfleet_accelerator": "tpu"}, "specfleet_accelerator"),
        ({"specfleet_server_port": "http"}, "specfleet_server_port"),
        ({"vllm_server_dtype": "fp4"}, "vllm_server_dtype"),
        ({"specfleet_num_speculative_tokens": "many"}, "specfleet_num_speculative_tokens"),
        ({"vllm_server_extra_args": {"--enforce-eager": True}}, "vllm_server_extra_args"),
        ({"vllm_server_environment": ["A=1"]}, "vllm_server_environment"),
    ],
)
def test_argument_spec_rejects(ansible, extra, message):
    result = ansible.playbook(_role_play(), extra, "--check")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "Validation of arguments failed" in out
    assert message in out
    assert "Create the service" not in out


@pytest.mark.parametrize("entry_point", ["prepare", "restart", "gate"])
def test_argument_spec_rejects_at_the_entry_points_of_a_fleet(ansible, entry_point):
    """site.yml, upgrade.yml and train_drafter.yml enter the role at these files. Named
    `prepare.yml`, Ansible checked no variable there and a value of the wrong type went on."""
    extra = {"vllm_server_dtype": "fp4"}
    result = ansible.playbook(_role_play(entry_point), extra, "--check")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert f"Validating arguments against arg spec '{entry_point}'" in out
    assert "Validation of arguments failed" in out and "vllm_server_dtype" in out


def _drafter(tmp_path: Path, config: dict | None) -> Path:
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    if config is not None:
        (drafter / "config.json").write_text(json.dumps(config))
    return drafter


@pytest.mark.parametrize(
    ("extra", "config", "message"),
    [
        (
            {"specfleet_num_speculative_tokens": 17},
            {"architectures": ["LlamaForCausalLMEagle3"]},
            "num_speculative_tokens must be in 1..16, got 17",
        ),
        (
            {"specfleet_num_speculative_tokens": 0},
            {"architectures": ["LlamaForCausalLMEagle3"]},
            "num_speculative_tokens must be in 1..16, got 0",
        ),
        ({}, None, "config.json is missing"),
        ({}, {"architectures": ["LlamaForCausalLM"]}, "is not an EAGLE-3 drafter"),
        (
            {"vllm_server_extra_args": ["--api-key", "x"]},
            {"architectures": ["LlamaForCausalLMEagle3"]},
            "never --api-key",
        ),
        (
            {"specfleet_user": "root"},
            {"architectures": ["LlamaForCausalLMEagle3"]},
            "never runs as root",
        ),
        (
            {"vllm_server_environment": {"PYTHONPYCACHEPREFIX": "/var/cache/pyc"}},
            {"architectures": ["LlamaForCausalLMEagle3"]},
            "no PYTHONPYCACHEPREFIX",
        ),
        (
            {"specfleet_server_port": 80},
            {"architectures": ["LlamaForCausalLMEagle3"]},
            "port 1024-65535 (a privileged port needs a capability the sandbox removes)",
        ),
        (
            {"specfleet_model": "models/target"},
            {"architectures": ["LlamaForCausalLMEagle3"]},
            "the model is an absolute path",
        ),
    ],
)
def test_validation_rejects_before_changes(ansible, tmp_path, extra, config, message):
    drafter = _drafter(tmp_path, config)
    result = ansible.playbook(_role_play(), {"specfleet_drafter": str(drafter), **extra}, "--check")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert message in " ".join(out.split())
    assert "Create the service" not in out


def _validate_on_a_ready_host(ansible, drafter_config, **extra):
    """Run validate.yml where the target model, the stack's python and the project's
    host-side Python exist."""
    tmp_path = ansible.tmp_path
    drafter = _drafter(tmp_path, drafter_config)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    variables = {
        "specfleet_drafter": str(drafter),
        "specfleet_model": str(model),
        "specfleet_stack_venv": str(venv_bin.parent),
        "specfleet_pythonpath": str(ROOT / "src"),
        # The account must exist (the common role makes it); nobody exists here.
        "specfleet_user": "nobody",
    }
    return ansible.playbook(_role_play("validate.yml"), {**variables, **extra}, "--check")


@pytest.mark.parametrize(
    "config",
    [
        {"architectures": ["LlamaForCausalLMEagle3"]},
        {"architectures": ["Eagle3LlamaForCausalLM"]},
        {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3"},
        {"speculators_model_type": "eagle3"},
    ],
)
def test_validation_accepts_eagle3_drafters(ansible, config):
    result = _validate_on_a_ready_host(ansible, config)
    assert result.returncode == 0, result.stdout + result.stderr


def test_validation_requires_the_service_account(ansible):
    result = _validate_on_a_ready_host(
        ansible,
        {"architectures": ["LlamaForCausalLMEagle3"]},
        specfleet_user="specfleet-no-such-account",
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "specfleet-no-such-account does not exist: apply the common role first" in out


def test_a_linked_model_is_served_from_its_folder_under_the_links_name(ansible):
    """pinned_model and packaged_model reach the model by a link: the unit names the folder
    the link names (a moved link changes the unit, so the server restarts through its gate
    onto the new model, or back onto the old one), and clients keep the link's name."""
    host = {
        "read": HOST_READ["read"],
        "paths": HOST_READ["paths"]
        | {"/var/lib/specfleet/models/target": {"islink": True, "target": "tiny-0123456789abcdef"}},
    }
    cmd = exec_start(render(ansible, __vllm_server_host=host)[0])
    assert "--model /var/lib/specfleet/models/tiny-0123456789abcdef " in cmd
    assert "--served-model-name /var/lib/specfleet/models/target " in cmd
    # An explicit name wins; the folder still serves.
    cmd = exec_start(
        render(ansible, __vllm_server_host=host, vllm_server_served_model_name="kimi")[0]
    )
    assert "--model /var/lib/specfleet/models/tiny-0123456789abcdef " in cmd
    assert "--served-model-name kimi " in cmd
