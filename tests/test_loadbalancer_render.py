"""Role loadbalancer: HAProxy's configuration rendered by Ansible for a fleet of three.

HAProxy itself checks it in the lab, where the fleet's upgrades run (the template's `haproxy
-c` validation) and serves through it under load, and tests/test_front_door.py attacks its
front door; here the settings a rolling restart relies on are read off the rendered file
(health checks, retries on another server, slowstart, the root-only admin socket, TLS when a
certificate is named, one server line per host at its own address), the front door's rules
and maps, and the checks that refuse bad keys and routes before anything changes.
"""

from __future__ import annotations

import hashlib

from conftest import ROOT, role_vars_files

KEY = hashlib.sha256(b"sf-test-key").hexdigest()
KEYS = [{"name": "team-a", "sha256": KEY}]

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
    return ansible.playbook(
        [play], {"loadbalancer_api_keys": KEYS} | extra, inventory=str(inventory)
    )


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


def check(ansible, servers: str = THREE_SERVERS, **extra) -> tuple[int, str]:
    """Run the role's checks (tasks/check.yml) as the balancer of ``servers``."""
    tasks = [{"ansible.builtin.import_tasks": str(ROLE / "tasks" / "check.yml")}]
    result = as_balancer(ansible, servers, tasks, **extra)
    return result.returncode, result.stdout + result.stderr


def test_a_bad_setting_is_refused_with_the_rules(ansible):
    code, output = check(ansible, loadbalancer_port=70000)
    assert code != 0, output
    assert "The ports must be 1-65535." in output
    assert "Nothing was changed." in output


def test_the_front_door_rules_and_maps(ansible):
    lines = render(ansible, loadbalancer_extra_routes=[{"method": "POST", "path": "/v1/responses"}])
    routes = next(line for line in lines if line.startswith("acl specfleet_route_allowed"))
    assert routes == (
        'acl specfleet_route_allowed var(txn.route) -m str "POST /v1/completions"'
        ' "POST /v1/chat/completions" "GET /v1/models" "POST /v1/responses"'
    )
    text = "\n".join(lines)
    # The key is looked up by its hash, the route matched as written, every refusal
    # counted and answered at the door, the client's key never forwarded.
    assert (
        "http_auth_bearer,sha2(256),hex,lower,map_str(/etc/haproxy/specfleet-client-keys.map)"
        in text
    )
    assert 'set-var-fmt(txn.route) "%[method] %[path]"' in text
    assert "track-sc1 var(txn.refused) table specfleet_refusals if specfleet_refused" in text
    assert "http-request del-header Authorization" in text
    assert "req.hdr_val(content-length) gt 4194304" in text
    # vLLM's /health is not forwarded: the door answers its own.
    assert "http-request return status 200" in text and "{ path /health }" in text
    # No metrics listener unless monitoring addresses are named.
    assert "frontend metrics" not in text
    with_metrics = render(ansible, loadbalancer_monitoring_clients=["10.0.0.9"])
    assert "tcp-request connection reject unless { src 10.0.0.9 }" in with_metrics
    assert "use_backend metrics_gpu-2 if { path /servers/gpu-2/metrics }" in with_metrics


def maps(ansible, **extra) -> dict[str, str]:
    """The front door's maps as the role writes them."""
    out = ansible.tmp_path / "maps.json"
    tasks = [
        {
            "ansible.builtin.copy": {
                "content": "{{ __loadbalancer_maps | to_json }}",
                "dest": str(out),
                "mode": "0600",
            }
        }
    ]
    result = as_balancer(ansible, THREE_SERVERS, tasks, **extra)
    assert result.returncode == 0, result.stdout + result.stderr
    import json

    return {item["path"].rsplit("/", 1)[1]: item["content"] for item in json.loads(out.read_text())}


def test_the_maps_hold_hashes_names_and_rates_never_a_client_key(ansible):
    keys = [*KEYS, {"name": "batch", "sha256": KEY.upper()[:-1] + "F", "requests_per_minute": 60}]
    written = maps(ansible, loadbalancer_api_keys=keys, specfleet_server_api_key="sk-server.1~")
    entries = {name: content.splitlines()[1:] for name, content in written.items()}
    assert entries["specfleet-client-keys.map"] == [f"{KEY} team-a", f"{KEY[:-1].lower()}f batch"]
    assert entries["specfleet-key-rates.map"] == ["batch 60"]
    assert entries["specfleet-server-key.map"] == ["server sk-server.1~"]
    # Each starts with a comment that says what it holds (HAProxy skips it).
    assert all(content.startswith("# ") for content in written.values())
    assert maps(ansible)["specfleet-server-key.map"].splitlines()[1:] == []


def test_bad_keys_and_routes_are_refused_before_anything_changes(ansible):
    for extra, message in [
        ({"loadbalancer_api_keys": []}, "loadbalancer_api_keys is empty"),
        (
            {"loadbalancer_api_keys": [{"name": "a", "sha256": "sk-the-key-itself"}]},
            'sha256 "sk-the-key-itself", which is not 64 hex digits',
        ),
        ({"loadbalancer_api_keys": [{"name": "a b", "sha256": KEY}]}, 'The key name "a b"'),
        (
            {"loadbalancer_api_keys": [*KEYS, {"name": "team-a", "sha256": "0" * 64}]},
            "Key names repeat",
        ),
        ({"loadbalancer_api_keys": [*KEYS, {"name": "b", "sha256": KEY}]}, "the same sha256"),
        (
            {"loadbalancer_extra_routes": [{"method": "POST", "path": "/%69nvocations"}]},
            'The route path "/%69nvocations" is not a plain absolute path',
        ),
        (
            {"loadbalancer_extra_routes": [{"method": "GET", "path": "/v1/../metrics"}]},
            'The route path "/v1/../metrics"',
        ),
        (
            {"specfleet_server_api_key": "two words"},
            "specfleet_server_api_key must be a bearer token",
        ),
        (
            {"vllm_server_api_key": "old"},
            "vllm_server_api_key was renamed specfleet_server_api_key",
        ),
    ]:
        code, output = check(ansible, **extra)
        assert code != 0 and message in output and "Nothing was changed." in output, (extra, output)


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
