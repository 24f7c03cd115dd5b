"""Role loadbalancer: HAProxy's configuration rendered by Ansible for a fleet of three.

HAProxy itself checks it in the fleet scenario (the template's `haproxy -c` validation) and
serves through it under load; here the settings a rolling restart relies on are read off
the rendered file: health checks, retries on another server, slowstart, the root-only admin
socket, TLS when a certificate is named, one server line per host at its own address.
"""

from __future__ import annotations

from conftest import ROOT, role_vars_files

ROLE = ROOT / "roles" / "loadbalancer"


THREE_SERVERS = (
    "        gpu-1: {specfleet_server_address: 10.0.0.1}\n"
    "        gpu-2: {specfleet_server_address: 10.0.0.2, specfleet_server_port: 8001}\n"
    "        gpu-3: {specfleet_server_address: 10.0.0.3}\n"
)


def as_balancer(ansible, servers: str, tasks: list, **extra):
    """Run ``tasks`` with the role's variables on localhost, the balancer of ``servers``
    (inventory lines of the gpu_hosts group)."""
    inventory = ansible.tmp_path / "hosts.yml"
    inventory.write_text(
        f"all:\n  children:\n    gpu_hosts:\n      hosts:\n{servers}"
        "    loadbalancers:\n      hosts:\n        localhost: {ansible_connection: local}\n"
    )
    play = {
        "name": "The balancer's role, on localhost",
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": role_vars_files("loadbalancer", profile=False),
        "tasks": tasks,
    }
    return ansible.playbook([play], extra, inventory=str(inventory))


def render(ansible, **extra) -> list[str]:
    out = ansible.tmp_path / "haproxy.cfg"
    template = {"src": str(ROLE / "templates" / "haproxy.cfg.j2"), "dest": str(out), "mode": "0600"}
    result = as_balancer(ansible, THREE_SERVERS, [{"ansible.builtin.template": template}], **extra)
    assert result.returncode == 0, result.stdout + result.stderr
    return [line.strip() for line in out.read_text().splitlines()]


def test_what_a_rolling_restart_relies_on(ansible):
    lines = render(ansible)
    for line in (
        "option httpchk GET /health",
        "http-check expect status 200",
        "option redispatch 1",
        "retries 3",
        "retry-on conn-failure empty-response response-timeout 503",
        "default-server inter 2000ms fall 2 rise 2 slowstart 30s",
        "stats socket /run/haproxy/admin.sock mode 600 level admin expose-fd listeners",
        "bind 0.0.0.0:8080",
        "server gpu-1 10.0.0.1:8000 check",
        "server gpu-2 10.0.0.2:8001 check",
        "server gpu-3 10.0.0.3:8000 check",
    ):
        assert line in lines, line


def test_tls_on_the_front_door_when_a_certificate_is_named(ansible):
    lines = render(ansible, loadbalancer_tls_certificate="/etc/haproxy/vllm.pem")
    assert "bind 0.0.0.0:8080 ssl crt /etc/haproxy/vllm.pem" in lines


def check(ansible, servers: str) -> tuple[int, str]:
    """Run the role's checks (tasks/check.yml) as the balancer of ``servers``."""
    tasks = [{"ansible.builtin.import_tasks": str(ROLE / "tasks" / "check.yml")}]
    result = as_balancer(ansible, servers, tasks)
    return result.returncode, result.stdout + result.stderr


def test_a_bad_setting_is_refused_with_the_rules(ansible):
    tasks = [{"ansible.builtin.import_tasks": str(ROLE / "tasks" / "check.yml")}]
    result = as_balancer(ansible, THREE_SERVERS, tasks, loadbalancer_port=70000)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "the group gpu_hosts must have hosts (has 3); port 1-65535" in output
    assert "Nothing was changed." in output


def test_a_server_address_made_from_facts_not_gathered_is_refused(ansible):
    # upgrade.yml once rendered every server at 127.0.0.1 this way: all DOWN, all 503.
    code, output = check(
        ansible,
        "        gpu-1: {specfleet_server_address: 10.0.0.1}\n"
        "        gpu-2: {specfleet_server_address: '{{ ansible_facts.default_ipv4.address }}'}\n"
        "        gpu-3: {}\n",
    )
    assert code != 0, output
    assert "gpu-2, gpu-3 would be reached at a loopback address" in output
    assert "gpu-1" not in output.split("would be reached")[0].split("loadbalancer:")[-1]


def test_a_balancer_in_front_of_its_own_host_may_dial_loopback(ansible):
    code, output = check(
        ansible, "        localhost: {}\n        gpu-1: {specfleet_server_address: 10.0.0.1}\n"
    )
    assert code == 0, output
