"""The client against a secured cluster (docs/security.md): TLS with the cluster CA, a
client certificate, bearer tokens with roles, and the environment defaults batonctl uses
($BATON_COORDINATOR, $BATON_TLS_CA, $BATON_TOKEN)."""

import os
import subprocess

import pytest

import baton

from conftest import REPO, running_cluster, tiny_gpt

SUBMITTER = "py-submitter-token-0123456789abcdef"
VIEWER = "py-viewer-token-0123456789abcdef00"


@pytest.fixture(scope="module")
def secure(request):
    def configure(c):
        tls, other = os.path.join(c.tmp, "tls"), os.path.join(c.tmp, "other-ca")
        for d, n in ((tls, "2"), (other, "1")):
            r = subprocess.run(["bash", os.path.join(REPO, "scripts", "make-certs.sh"), d, n],
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
        tokens = os.path.join(c.tmp, "tokens")
        with open(tokens, "w") as f:
            f.write(f"{SUBMITTER} sam submitter\n{VIEWER} vic viewer\n")
        c.coordinator_flags = ["--tls_cert", f"{tls}/coordinator.pem",
                               "--tls_key", f"{tls}/coordinator.key",
                               "--tls_ca", f"{tls}/ca.pem", "--auth_tokens", tokens]
        certs = {"w-1": "worker-0", "w-2": "worker-1"}
        c.worker_flags = lambda w: ["--tls_cert", f"{tls}/{certs[w]}.pem",
                                    "--tls_key", f"{tls}/{certs[w]}.key",
                                    "--tls_ca", f"{tls}/ca.pem"]
        c.env = {"BATON_TLS_CA": f"{tls}/ca.pem", "BATON_TOKEN": SUBMITTER}
        c.tls, c.other_ca = tls, other

    with running_cluster(request, "tls", 2, configure) as c:
        yield c


def test_tls_and_a_submitter_token_train_a_job(secure):
    with baton.Client(secure.address, token=SUBMITTER,
                      tls=baton.TLS(ca=f"{secure.tls}/ca.pem")) as client:
        path = secure.write_spec(tiny_gpt("py-tls", steps=3))
        job = client.wait(client.submit(path), timeout=120)
        assert job.submitted_by == "sam"
        assert job.weights_digest == secure.reference_digest(path)
        assert [w.identity for w in sorted(client.workers(), key=lambda w: w.id)] == \
            ["baton-worker-0", "baton-worker-1"]


def test_client_certificate_and_server_name(secure):
    tls = baton.TLS(ca=f"{secure.tls}/ca.pem", cert=f"{secure.tls}/client.pem",
                    key=f"{secure.tls}/client.key", server_name="baton")
    with baton.Client(secure.address, token=VIEWER, tls=tls) as client:
        assert any(j.name == "py-tls" for j in client.list())


def test_roles_and_missing_tokens_are_refused(secure):
    ca = f"{secure.tls}/ca.pem"
    with baton.Client(secure.address, token="", tls=ca) as anonymous:
        with pytest.raises(baton.Unauthenticated):
            list(anonymous.list())
    with baton.Client(secure.address, token="not-a-known-token-at-all", tls=ca) as stranger:
        with pytest.raises(baton.Unauthenticated) as e:
            stranger.workers()
        assert "not-a-known-token" not in str(e.value)
    with baton.Client(secure.address, token=VIEWER, tls=ca) as viewer:
        assert viewer.workers()
        with pytest.raises(baton.PermissionDenied) as e:
            viewer.submit(tiny_gpt("py-viewer", steps=1))
        assert "vic" in e.value.message and isinstance(e.value, PermissionError)


def test_wrong_ca_or_plaintext_cannot_connect(secure):
    for tls in (False, f"{secure.other_ca}/ca.pem"):
        with baton.Client(secure.address, token=SUBMITTER, tls=tls, timeout=5) as client:
            with pytest.raises(baton.Unavailable) as e:
                client.workers()
            assert secure.address in str(e.value)


def test_environment_defaults_like_batonctl(secure, monkeypatch):
    monkeypatch.setenv("BATON_COORDINATOR", secure.address)
    monkeypatch.setenv("BATON_TLS_CA", f"{secure.tls}/ca.pem")
    monkeypatch.setenv("BATON_TOKEN", VIEWER)
    with baton.Client() as client:
        assert client.address == secure.address
        assert len(client.workers()) == 2
        with pytest.raises(baton.PermissionDenied):
            client.cancel("job-000001")
