"""Role monitoring: its Prometheus configuration, recording rules and alerts, rendered by
Ansible for a fleet of two servers behind a balancer, checked and unit-tested by Prometheus'
own promtool (tests/promtool.py: the binary of Debian's package, the one the role installs).

`promtool test rules` runs each rule over synthetic series: the recording rules must give
vLLM's own ratio (1 + accepted / drafts), and every alert must fire on its cause and clear
when the cause is gone. The lab (tests/test_cli_lab.py) checks the same rules on real
servers' series.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml
from conftest import ROOT, Ansible, role_vars_files
from promtool import promtool

ROLE = ROOT / "roles" / "monitoring"
SERVERS = (
    # gpu-1's health gate has a floor of its own: the alert holds it to that one.
    "        gpu-1: {ansible_host: 10.0.0.1, vllm_server_gate_min_mean_acceptance_length: 2.0}\n"
    "        gpu-2: {ansible_host: 10.0.0.2}\n"
    "        gpu-3: {ansible_host: 10.0.0.3}\n"
)


def render(ansible, servers: str = SERVERS, balancer: bool = True, **extra):
    """The role's three files, rendered on localhost (the monitoring host) into tmp_path,
    the configuration naming the rendered rule files."""
    out = ansible.tmp_path
    inventory = out / "hosts.yml"
    inventory.write_text(
        f"all:\n  children:\n    gpu_hosts:\n      hosts:\n{servers}"
        + (
            "    loadbalancers:\n      hosts:\n        lb-1: {ansible_host: 10.0.0.10}\n"
            if balancer
            else ""
        )
        + "    monitoring:\n      hosts:\n        localhost: {ansible_connection: local}\n"
    )
    tasks = [
        {
            "ansible.builtin.template": {
                "src": str(ROLE / "templates" / name),
                "dest": str(out / name[:-3]),
                "mode": "0600",
            }
        }
        for name in ("prometheus.yml.j2", "recording.yml.j2", "alerts.yml.j2")
    ]
    play = {
        "name": "The monitoring role's files, on localhost",
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": role_vars_files("monitoring", profile=False),
        "tasks": tasks,
    }
    result = ansible.playbook(
        [play], {"__monitoring_rules_dir": str(out)} | extra, inventory=str(inventory)
    )
    return result, out


def promtool_run(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool()), *args], capture_output=True, text=True, check=False, cwd=cwd
    )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Rendered once for the module's tests (each render is an ansible-playbook run)."""
    result, out = render(Ansible(tmp_path_factory.mktemp("monitoring")))
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_promtool_accepts_the_configuration_and_both_rule_files(rendered):
    checked = promtool_run("check", "config", str(rendered / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # check config reads the rule files it names: both were found and are valid.
    assert "recording.yml" in checked.stdout and "alerts.yml" in checked.stdout
    assert "SUCCESS" in checked.stdout


def test_every_server_is_scraped_through_the_balancer_as_its_inventory_name(rendered):
    config = yaml.safe_load((rendered / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job["static_configs"] for job in config["scrape_configs"]}
    assert sorted(jobs) == ["haproxy", "vllm"]
    assert [
        (c["targets"], c["labels"]["instance"], c["labels"]["__metrics_path__"])
        for c in jobs["vllm"]
    ] == [(["10.0.0.10:8405"], f"gpu-{n}", f"/servers/gpu-{n}/metrics") for n in (1, 2, 3)]
    assert [(c["targets"], c["labels"]["instance"]) for c in jobs["haproxy"]] == [
        (["10.0.0.10:8405"], "lb-1")
    ]


def test_without_a_balancer_the_servers_are_scraped_where_they_listen(ansible):
    servers = (
        "        gpu-1: {ansible_host: 10.0.0.1, specfleet_server_address: 10.0.0.1}\n"
        "        gpu-2: {ansible_host: 10.0.0.2, specfleet_server_address: 0.0.0.0,"
        " specfleet_server_port: 8001}\n"
    )
    result, out = render(ansible, servers, balancer=False)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert [(c["targets"], c["labels"]["__metrics_path__"]) for c in job["static_configs"]] == [
        (["10.0.0.1:8000"], "/metrics"),
        (["10.0.0.2:8001"], "/metrics"),
    ]


def test_each_server_is_held_to_its_gates_floor_or_the_roles(rendered):
    rules = yaml.safe_load((rendered / "alerts.yml").read_text())
    floors = {
        rule["labels"]["instance"]: rule["expr"]
        for group in rules["groups"]
        for rule in group["rules"]
        if rule.get("record") == "instance:specfleet_acceptance_floor:value"
    }
    assert floors == {"gpu-1": "vector(2.0)", "gpu-2": "vector(1.5)", "gpu-3": "vector(1.5)"}


def test_every_alert_has_a_summary_a_description_and_a_runbook(rendered):
    rules = yaml.safe_load((rendered / "alerts.yml").read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]
    assert {a["alert"] for a in alerts} == {
        "SpecfleetAcceptanceBelowFloor",
        "SpecfleetAcceptanceBelowFleetMedian",
        "SpecfleetServerDown",
        "SpecfleetQueueGrowing",
        "SpecfleetBalancer5xx",
    }
    for alert in alerts:
        assert set(alert["annotations"]) == {"summary", "description", "runbook"}, alert
        assert alert["annotations"]["runbook"].startswith("1. "), alert["alert"]


def test_bad_settings_are_refused_before_anything_changes(ansible):
    """The role's own check, run as the role runs it (nothing installed: it stops first)."""
    inventory = ansible.tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    gpu_hosts:\n      hosts:\n        gpu-1: {}\n"
        "    monitoring:\n      hosts:\n        localhost: {ansible_connection: local}\n"
    )
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "roles": [{"role": "monitoring"}],
    }
    result = ansible.playbook(
        [play],
        {
            "monitoring_rate_window": "five minutes",
            "monitoring_min_mean_acceptance_length": 0.5,
            "monitoring_port": 70000,
        },
        inventory=str(inventory),
    )
    assert result.returncode != 0
    said = result.stdout
    assert '"five minutes" is not a Prometheus duration' in said
    assert "The acceptance floor of gpu-1 is below 1.0" in said
    assert "monitoring_port must be 1-65535" in said
    assert "Nothing was changed." in said
    assert "Install Prometheus" not in said


# ----------------------------------------------------------------- promtool test rules
def _without_annotations(rendered) -> str:
    """The alert rules as rendered, less their annotations: `promtool test rules` compares
    annotations whole, and their texts are checked above; the rules themselves are not
    touched."""
    rules = yaml.safe_load((rendered / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path = rendered / "alerts-for-test.yml"
    path.write_text(yaml.safe_dump(rules))
    return path.name


def _counters(instance: str, drafts: str, accepted: str, per_position: list[str]) -> list:
    labels = f'instance="{instance}",job="vllm",model_name="m",engine="0"'
    series = [
        {"series": f"vllm:spec_decode_num_drafts_total{{{labels}}}", "values": drafts},
        {"series": f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}}", "values": accepted},
    ]
    series += [
        {
            "series": f"vllm:spec_decode_num_accepted_tokens_per_pos_total"
            f'{{{labels},position="{p}"}}',
            "values": values,
        }
        for p, values in enumerate(per_position)
    ]
    return series


def _run_tests(rendered, tests: list) -> None:
    document = {
        "rule_files": ["recording.yml", _without_annotations(rendered)],
        "evaluation_interval": "1m",
        "tests": tests,
    }
    (rendered / "tests.yml").write_text(yaml.safe_dump(document, sort_keys=False))
    result = promtool_run("test", "rules", "tests.yml", cwd=rendered)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_recording_rules_give_vllms_own_ratios(rendered):
    """16 drafts and 14 accepted tokens a minute: mean acceptance length 1 + 14/16 = 1.875,
    position by position 8/16, 4/16, 2/16; per server and fleet-wide. (Figures exact in
    binary: this promtool compares samples exactly.)"""
    series = _counters("gpu-1", "0+16x30", "0+14x30", ["0+8x30", "0+4x30", "0+2x30"])
    series += [
        {
            "series": 'vllm:spec_decode_num_draft_tokens_total{instance="gpu-1"}',
            "values": "0+56x30",
        },
        {"series": 'vllm:generation_tokens_total{instance="gpu-1"}', "values": "0+600x30"},
    ]

    def expect(name: str, samples: list[tuple[str, float]]) -> dict:
        return {
            "expr": name,
            "eval_time": "20m",
            "exp_samples": [
                {"labels": f'{{__name__="{name}"{labels}}}', "value": value}
                for labels, value in samples
            ],
        }

    one = ',instance="gpu-1"'
    _run_tests(
        rendered,
        [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    expect(
                        "instance:vllm_spec_decode_mean_acceptance_length:ratio_rate",
                        [(one, 1.875)],
                    ),
                    expect(
                        "fleet:vllm_spec_decode_mean_acceptance_length:ratio_rate", [("", 1.875)]
                    ),
                    expect(
                        "instance:vllm_spec_decode_acceptance_by_position:ratio_rate",
                        [(f'{one},position="{p}"', v) for p, v in enumerate([0.5, 0.25, 0.125])],
                    ),
                    expect(
                        "fleet:vllm_spec_decode_acceptance_by_position:ratio_rate",
                        [(f',position="{p}"', v) for p, v in enumerate([0.5, 0.25, 0.125])],
                    ),
                    expect(
                        "instance:vllm_spec_decode_draft_acceptance_rate:ratio_rate", [(one, 0.25)]
                    ),
                    expect("instance:vllm_generation_tokens:rate", [(one, 10)]),
                ],
            }
        ],
    )


def test_a_poor_drafter_alerts_at_its_servers_floor_and_clears_when_replaced(rendered):
    """gpu-1 (floor 2.0, its gate's) serves a drafter at 1.5 for 30 minutes, then one at 2.5;
    gpu-2 (floor 1.5) serves 1.8 throughout: only gpu-1 alerts, after 10 minutes, until its
    better drafter has filled the window."""
    poor_then_good = "0+10x30 310+10x30"
    series = _counters("gpu-1", poor_then_good, "0+5x30 155+15x30", [])
    series += _counters("gpu-2", "0+10x60", "0+8x60", [])
    firing = [
        {
            "exp_labels": {
                "alertname": "SpecfleetAcceptanceBelowFloor",
                "instance": "gpu-1",
                "severity": "warning",
            }
        }
    ]
    _run_tests(
        rendered,
        [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    # Under the floor, but not yet for 10 minutes.
                    {
                        "eval_time": "8m",
                        "alertname": "SpecfleetAcceptanceBelowFloor",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "20m",
                        "alertname": "SpecfleetAcceptanceBelowFloor",
                        "exp_alerts": firing,
                    },
                    # The better drafter since 31m: the 5-minute window is all of it by 37m.
                    {
                        "eval_time": "40m",
                        "alertname": "SpecfleetAcceptanceBelowFloor",
                        "exp_alerts": [],
                    },
                ],
            }
        ],
    )


def test_a_server_far_below_the_fleets_median_alerts(rendered):
    series = _counters("gpu-1", "0+10x30", "0+20x30", [])  # 3.0
    series += _counters("gpu-2", "0+10x30", "0+19x30", [])  # 2.9
    series += _counters("gpu-3", "0+10x30", "0+12x30", [])  # 2.2: 0.7 below the median
    _run_tests(
        rendered,
        [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": "25m",
                        "alertname": "SpecfleetAcceptanceBelowFleetMedian",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "alertname": "SpecfleetAcceptanceBelowFleetMedian",
                                    "instance": "gpu-3",
                                    "severity": "warning",
                                }
                            }
                        ],
                    },
                    # Above every floor: the floor alert stays quiet.
                    {
                        "eval_time": "25m",
                        "alertname": "SpecfleetAcceptanceBelowFloor",
                        "exp_alerts": [],
                    },
                ],
            }
        ],
    )


def test_a_stopped_server_alerts_and_clears_when_it_is_back(rendered):
    down = {
        "alertname": "SpecfleetServerDown",
        "instance": "gpu-2",
        "job": "vllm",
        "severity": "critical",
    }
    _run_tests(
        rendered,
        [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'up{job="vllm",instance="gpu-1"}', "values": "1x30"},
                    {"series": 'up{job="vllm",instance="gpu-2"}', "values": "1x5 0x10 1x15"},
                ],
                "alert_rule_test": [
                    {"eval_time": "6m", "alertname": "SpecfleetServerDown", "exp_alerts": []},
                    {
                        "eval_time": "9m",
                        "alertname": "SpecfleetServerDown",
                        "exp_alerts": [{"exp_labels": down}],
                    },
                    {"eval_time": "18m", "alertname": "SpecfleetServerDown", "exp_alerts": []},
                ],
            }
        ],
    )


def test_a_growing_queue_alerts_and_a_steady_one_does_not(rendered):
    labels = 'job="vllm",model_name="m",engine="0"'
    _run_tests(
        rendered,
        [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f'vllm:num_requests_waiting{{instance="gpu-1",{labels}}}',
                        "values": "0+1x40",
                    },
                    {
                        "series": f'vllm:num_requests_waiting{{instance="gpu-2",{labels}}}',
                        "values": "20x40",
                    },
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "30m",
                        "alertname": "SpecfleetQueueGrowing",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "alertname": "SpecfleetQueueGrowing",
                                    "instance": "gpu-1",
                                    "severity": "warning",
                                }
                            }
                        ],
                    }
                ],
            }
        ],
    )


def test_5xx_at_the_front_door_alert_and_refusals_do_not(rendered):
    base = 'haproxy_frontend_http_responses_total{instance="lb-1",job="haproxy",proxy="vllm"'
    _run_tests(
        rendered,
        [
            {
                "interval": "1m",
                "input_series": [
                    # 60 refusals a minute (4xx) throughout; 5xx only from minute 10.
                    {"series": base + ',code="4xx"}', "values": "0+60x40"},
                    {"series": base + ',code="5xx"}', "values": "0x10 0+30x30"},
                ],
                "alert_rule_test": [
                    {"eval_time": "9m", "alertname": "SpecfleetBalancer5xx", "exp_alerts": []},
                    {
                        "eval_time": "25m",
                        "alertname": "SpecfleetBalancer5xx",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "alertname": "SpecfleetBalancer5xx",
                                    "instance": "lb-1",
                                    "severity": "critical",
                                }
                            }
                        ],
                    },
                ],
            }
        ],
    )


def test_the_dashboard_reads_only_rules_and_metrics_that_exist(rendered):
    """Grafana's dashboard (files/specfleet-vllm-dashboard.json): valid JSON with unique panel
    ids and a place on the grid each, every query on the dashboard's data source, and every
    recorded series it reads one the role's rules record. The lab runs every query against
    a real Prometheus (tests/test_cli_lab.py)."""
    dashboard = json.loads((ROLE / "files" / "specfleet-vllm-dashboard.json").read_text())
    assert dashboard["uid"] == "specfleet-vllm" and dashboard["panels"]
    recorded = {
        rule["record"]
        for name in ("recording.yml", "alerts.yml")
        for group in yaml.safe_load((rendered / name).read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = [panel["title"] for panel in dashboard["panels"]]
    assert any("by draft position" in title for title in titles)
    assert any("with and without speculation" in title for title in titles)
    for panel in dashboard["panels"]:
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            names = set(
                re.findall(r"\b((?:instance|fleet):[a-z0-9_]+:[a-z0-9_]+)\b", target["expr"])
            )
            assert names <= recorded, (panel["title"], names - recorded)


def test_grafanas_provisioning_names_the_dashboard_and_this_prometheus(ansible):
    """Where Grafana runs (monitoring_grafana_provisioning_dir), the role writes a dashboard
    provider, the dashboard and a data source: their contents as the role renders them."""
    inventory = ansible.tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    gpu_hosts:\n      hosts:\n        gpu-1: {}\n"
        "    monitoring:\n      hosts:\n        localhost: {ansible_connection: local}\n"
    )
    out = ansible.tmp_path / "provisioning"
    # The role's files/ as this play's own (a lookup outside the role searches beside it).
    (ansible.tmp_path / "files").symlink_to(ROLE / "files")
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": role_vars_files("monitoring", profile=False),
        "tasks": [
            {
                "ansible.builtin.copy": {
                    "content": "{{ item.content }}",
                    "dest": "{{ item.path }}",
                    "mode": "0600",
                },
                "loop": "{{ __monitoring_grafana_files }}",
            }
        ],
        # The folders the role makes (tasks/main.yml) before it writes the files.
        "pre_tasks": [
            {
                "ansible.builtin.file": {
                    "path": "{{ item }}",
                    "state": "directory",
                    "mode": "0700",
                },
                "loop": [f"{out}/dashboards/specfleet", f"{out}/datasources"],
            }
        ],
    }
    result = ansible.playbook(
        [play], {"monitoring_grafana_provisioning_dir": str(out)}, inventory=str(inventory)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    provider = yaml.safe_load((out / "dashboards" / "specfleet.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == str(out / "dashboards" / "specfleet")
    source = yaml.safe_load((out / "datasources" / "specfleet-prometheus.yaml").read_text())
    assert source["datasources"][0]["uid"] == "specfleet-prometheus"
    assert source["datasources"][0]["url"] == "http://127.0.0.1:9090"
    dashboard = json.loads((out / "dashboards" / "specfleet" / "specfleet-vllm.json").read_text())
    assert dashboard == json.loads((ROLE / "files" / "specfleet-vllm-dashboard.json").read_text())
    # The dashboard's data source variable defaults to the provisioned one.
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["current"]["value"] == "specfleet-prometheus"
