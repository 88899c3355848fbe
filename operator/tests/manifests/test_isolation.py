"""What may reach a ranker's ports, and which pods get an API token."""

from __future__ import annotations

from spec_fragments import example, first_container

from kvrank_operator import manifests as m
from kvrank_operator.spec import parse_spec


def test_only_pods_labelled_for_it_reach_a_rankers_admin_port_and_jobs_accept_nothing() -> None:
    spec = parse_spec(example("basic.yaml"))
    rankers, deny = m.network_policies(spec, "feed", "prod")
    assert rankers["spec"]["podSelector"]["matchLabels"] == m.ranker_selector("feed")
    open_rule, admin_rule = rankers["spec"]["ingress"]
    assert "from" not in open_rule  # scoring, probes, a queue proxy's statistics: from anywhere
    assert {p["port"] for p in open_rule["ports"]} == {"http", "grpc", 8082, "proxy-stats"}
    # behind a queue proxy the ranker's own port (8083) is in no rule: only the proxy reaches it
    assert admin_rule["ports"] == [{"port": 8081}]
    assert admin_rule["from"] == [{"podSelector": {"matchLabels": {m.ADMIN_ACCESS_LABEL: "true"}}}]
    # every pod of the instance: what no other policy allows is refused (the Jobs: all)
    assert "ingress" not in deny["spec"] and deny["spec"]["policyTypes"] == ["Ingress"]
    selector = deny["spec"]["podSelector"]["matchLabels"]
    job = m.purge_job(spec, "feed", "prod", "v-v1")
    bootstrap = next(
        o for o in m.managed_redis(spec, "feed", "prod", ("pw", "rpw")) if o["kind"] == "Job"
    )
    for j in (job, bootstrap):
        assert selector.items() <= j["spec"]["template"]["metadata"]["labels"].items()
        assert first_container(j)["resources"]["limits"]["ephemeral-storage"]
    # applied with the rankers, in every pass
    kinds = [d.kind for d in m.desired_rankers(spec, "feed", "prod", None, "k")]
    assert kinds.count("NetworkPolicy") == 2


def test_pods_that_call_no_api_get_no_service_account_token() -> None:
    spec = parse_spec(example("basic.yaml"))
    pods = [
        m.deployment(spec, "feed", "prod", "v1", spec.model.uri, 1, "stable"),
        m.purge_job(spec, "feed", "prod", "v-v1"),
        *(
            o
            for o in m.managed_redis(spec, "feed", "prod", ("pw", "rpw"))
            if "template" in o.get("spec", {})
        ),
    ]
    for obj in pods:
        assert obj["spec"]["template"]["spec"]["automountServiceAccountToken"] is False, obj["kind"]
    # a ServiceAccount the user names may be there for its token (a plugin calling an API)
    own = {**example("basic.yaml")}
    own["model"] = {**own["model"], "pod": {"serviceAccountName": "feed-reader"}}
    spec = parse_spec(own)
    pod = m.deployment(spec, "feed", "prod", "v1", spec.model.uri, 1, "stable")["spec"]["template"]
    assert "automountServiceAccountToken" not in pod["spec"]
    assert pod["spec"]["serviceAccountName"] == "feed-reader"
