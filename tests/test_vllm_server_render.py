"""Role vllm_server: render its unit and environment with real Ansible, check its validation.

Nothing here touches the host: templates render into a temporary directory, and the
validation plays run in check mode against localhost and stop before any change.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "roles" / "vllm_server"
ANSIBLE_BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
        "ANSIBLE_FILTER_PLUGINS": str(ROOT / "filter_plugins"),
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
        "ANSIBLE_NOCOLOR": "1",
        # Modules on localhost run with the controller venv (pyenv shims may lie).
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
    }


def _playbook(tmp_path: Path, plays: list[dict], extra: dict, *args: str):
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump(plays, sort_keys=False))
    extra_file = tmp_path / "extra.json"
    extra_file.write_text(json.dumps(extra))
    return subprocess.run(
        [
            str(ANSIBLE_BIN / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"@{extra_file}",
            *args,
            str(book),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def render(tmp_path: Path, **extra) -> tuple[str, str]:
    """Render the unit and the environment file with the role's defaults and vars."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    play = {
        "name": "Render vllm_server templates",
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
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
    result = _playbook(tmp_path, [play], extra)
    assert result.returncode == 0, result.stdout + result.stderr
    return (out / "unit").read_text(), (out / "env").read_text()


def exec_start(unit: str) -> str:
    """ExecStart= with its continuation lines joined."""
    text = unit.replace("\\\n", " ")
    [line] = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    return " ".join(line.split())


# --------------------------------------------------------------------------- unit


def test_unit_with_defaults_cuda(tmp_path):
    unit, env = render(tmp_path)
    cmd = exec_start(unit)
    assert cmd.startswith(
        "ExecStart=/opt/specfleet/venvs/current/bin/python -m vllm.entrypoints.openai.api_server"
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
        "Restart=on-failure",
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
        "ReadWritePaths=/var/lib/specfleet /var/cache/specfleet/vllm",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia-frontend rw",
        "DeviceAllow=char-nvidia-uvm rw",
        "EnvironmentFile=/etc/specfleet/specfleet-vllm.env",
        "ExecStartPre=/opt/specfleet/venvs/current/bin/python "
        "/opt/specfleet/bin/vllm-server-shm-clean",
        "WantedBy=multi-user.target",
    ):
        assert line in unit.splitlines(), line
    assert "PrivateDevices" not in unit
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_unit_profile_cpu(tmp_path):
    unit, env = render(tmp_path, accelerator="cpu")
    cmd = exec_start(unit)
    assert "--enforce-eager" in cmd
    assert "--gpu-memory-utilization" not in cmd
    assert "PrivateDevices=yes" in unit.splitlines()
    assert "DeviceAllow" not in unit
    assert "VLLM_CPU_KVCACHE_SPACE=4" in env.splitlines()


def test_env_file(tmp_path):
    _, env = render(
        tmp_path,
        vllm_server_api_key='s3cr"et\\x',
        vllm_server_environment={"VLLM_LOGGING_LEVEL": "DEBUG"},
    )
    lines = env.splitlines()
    assert "HF_HUB_OFFLINE=1" in lines
    assert 'VLLM_API_KEY="s3cr\\"et\\\\x"' in lines
    assert 'VLLM_LOGGING_LEVEL="DEBUG"' in lines


def test_no_api_key_line_without_key(tmp_path):
    _, env = render(tmp_path)
    assert "VLLM_API_KEY" not in env


def test_optional_arguments_and_quoting(tmp_path):
    unit, _ = render(
        tmp_path,
        vllm_server_served_model_name="tiny llama",
        vllm_server_max_model_len=4096,
        vllm_server_draft_tensor_parallel_size=1,
        vllm_server_num_speculative_tokens=5,
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


def test_speculation_off(tmp_path):
    unit, _ = render(tmp_path, vllm_server_speculative_enabled=False)
    assert "--speculative-config" not in unit
    assert "EAGLE-3)" not in unit  # the description says what it serves


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
@pytest.mark.parametrize("accelerator", ["cpu", "cuda"])
def test_systemd_accepts_unit_and_exposure(tmp_path, accelerator):
    unit, _ = render(tmp_path, accelerator=accelerator)
    path = tmp_path / "specfleet-vllm.service"
    path.write_text(unit)
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, check=False
    )
    # The venv and helper are not on this machine; anything else is a unit error.
    problems = [
        line
        for line in (verify.stdout + verify.stderr).splitlines()
        if line.strip()
        and "is not executable" not in line
        and "No such file or directory" not in line
        and "Command " not in line
    ]
    assert not problems, problems
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    [overall] = [line for line in security.stdout.splitlines() if "Overall exposure" in line]
    score = float(overall.split("service:")[1].split()[0])
    print(f"{accelerator}: {overall.strip()}")
    assert score <= 3.0, security.stdout


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
        ({"vllm_server_accelerator": "tpu"}, "vllm_server_accelerator"),
        ({"vllm_server_port": "http"}, "vllm_server_port"),
        ({"vllm_server_dtype": "fp4"}, "vllm_server_dtype"),
        ({"vllm_server_num_speculative_tokens": "many"}, "vllm_server_num_speculative_tokens"),
        ({"vllm_server_extra_args": {"--enforce-eager": True}}, "vllm_server_extra_args"),
        ({"vllm_server_environment": ["A=1"]}, "vllm_server_environment"),
    ],
)
def test_argument_spec_rejects(tmp_path, extra, message):
    result = _playbook(tmp_path, _role_play(), extra, "--check")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "Validation of arguments failed" in out
    assert message in out
    assert "Create the service" not in out


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
            {"vllm_server_num_speculative_tokens": 17},
            {"architectures": ["LlamaForCausalLMEagle3"]},
            "num_speculative_tokens 1..16 (got 17)",
        ),
        (
            {"vllm_server_num_speculative_tokens": 0},
            {"architectures": ["LlamaForCausalLMEagle3"]},
            "num_speculative_tokens 1..16 (got 0)",
        ),
        ({}, None, "config.json is missing"),
        ({}, {"architectures": ["LlamaForCausalLM"]}, "is not an EAGLE-3 drafter"),
        (
            {"vllm_server_extra_args": ["--api-key", "x"]},
            {"architectures": ["LlamaForCausalLMEagle3"]},
            "never --api-key",
        ),
        (
            {"vllm_server_user": "root"},
            {"architectures": ["LlamaForCausalLMEagle3"]},
            "never runs as root",
        ),
    ],
)
def test_validation_rejects_before_changes(tmp_path, extra, config, message):
    drafter = _drafter(tmp_path, config)
    result = _playbook(
        tmp_path, _role_play(), {"vllm_server_drafter": str(drafter), **extra}, "--check"
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert message in " ".join(out.split())
    assert "Create the service" not in out


def _validate_on_a_ready_host(tmp_path, drafter_config, **extra):
    """Run validate.yml where the target model and the stack's python exist."""
    drafter = _drafter(tmp_path, drafter_config)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    variables = {
        "vllm_server_drafter": str(drafter),
        "vllm_server_model": str(model),
        "vllm_server_venv": str(venv_bin.parent),
        # The account must exist (the common role makes it); nobody exists here.
        "vllm_server_user": "nobody",
    }
    return _playbook(tmp_path, _role_play("validate.yml"), {**variables, **extra}, "--check")


@pytest.mark.parametrize(
    "config",
    [
        {"architectures": ["LlamaForCausalLMEagle3"]},
        {"architectures": ["Eagle3LlamaForCausalLM"]},
        {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3"},
        {"speculators_model_type": "eagle3"},
    ],
)
def test_validation_accepts_eagle3_drafters(tmp_path, config):
    result = _validate_on_a_ready_host(tmp_path, config)
    assert result.returncode == 0, result.stdout + result.stderr


def test_validation_requires_the_service_account(tmp_path):
    result = _validate_on_a_ready_host(
        tmp_path,
        {"architectures": ["LlamaForCausalLMEagle3"]},
        vllm_server_user="specfleet-no-such-account",
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "specfleet-no-such-account does not exist: apply the common role first" in out


METRICS_SAMPLE = """\
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 69.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="tiny"} 3.0
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="tiny"} 1.7959702470090735e+09
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"} 9.0
"""


def test_gate_reads_speculative_counters(tmp_path):
    """The gate's counter sums (role vars) over a /metrics text in vLLM's format."""
    play = {
        "name": "Evaluate the gate's expressions",
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "tasks": [
            {
                "name": "Write the sums",
                "ansible.builtin.copy": {
                    "dest": str(tmp_path / "sums.json"),
                    "mode": "0600",
                    "content": "{{ {'before': vllm_server__draft_before | float, "
                    "'after': vllm_server__draft_after | float, "
                    "'accepted': vllm_server__accepted_after | float} | to_json }}",
                },
            }
        ],
    }
    result = _playbook(
        tmp_path,
        [play],
        {
            "vllm_server__metrics_before": {"content": "# nothing yet\n"},
            "vllm_server__metrics_after": {"content": METRICS_SAMPLE},
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    sums = json.loads((tmp_path / "sums.json").read_text())
    assert sums == {"before": 0.0, "after": 72.0, "accepted": 12.0}
