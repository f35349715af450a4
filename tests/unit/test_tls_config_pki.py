"""The `tls` section's validation, and the local PKI: files, modes, names, idempotence."""

from __future__ import annotations

import stat
import textwrap
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from danube.config import ConfigError, TlsConfig, load_settings
from danube.security.pki import CertPaths, PkiError, ensure_local_pki, issue_server_cert
from danube.security.tls import FileWatch, principal_of_peercert


def _load_error(tmp_path: Path, text: str) -> ConfigError:
    path = tmp_path / "danube.yml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    return caught.value


def test_tls_is_off_by_default_everywhere() -> None:
    settings = load_settings(None, environ={})
    for section in (settings.discovery, settings.ingest, settings.dispatcher):
        assert section.tls == TlsConfig()
        assert section.tls.enabled is False


def test_cert_without_key_is_a_config_error_naming_the_section(tmp_path: Path) -> None:
    error = _load_error(tmp_path, "discovery:\n  tls:\n    cert_file: /etc/danube/server.pem\n")
    assert [p.path for p in error.problems] == ["discovery.tls"]
    assert "cert_file and key_file go together" in error.problems[0].message


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("key_file: k.pem", "cert_file and key_file go together"),
        (
            "cert_file: c.pem\n    key_file: k.pem\n    client_auth: required",
            "needs client_ca_file",
        ),
        ("cert_file: c.pem\n    key_file: k.pem\n    client_ca_file: ca.pem", "say which"),
        ("client_ca_file: ca.pem\n    client_auth: optional", "needs cert_file"),
        (
            "cert_file: c.pem\n    key_file: k.pem\n    client_auth: maybe",
            "'optional' or 'required'",
        ),
        ("cert_file: c.pem\n    key_file: k.pem\n    reload_check_interval_s: -1", "greater"),
    ],
)
def test_incomplete_or_contradictory_tls_is_refused(tmp_path: Path, body: str, words: str) -> None:
    error = _load_error(tmp_path, f"ingest:\n  tls:\n    {body}\n")
    assert error.problems[0].path.startswith("ingest.tls")
    assert words in error.problems[0].message


def test_a_complete_mtls_section_loads(tmp_path: Path) -> None:
    path = tmp_path / "danube.yml"
    path.write_text(
        "discovery:\n  tls:\n    cert_file: s.pem\n    key_file: s-key.pem\n"
        "    client_ca_file: ca.pem\n    client_auth: required\n"
    )
    tls = load_settings(path, environ={}).discovery.tls
    assert tls.enabled
    assert tls.client_auth == "required"
    assert tls.client_ca_file == Path("ca.pem")


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_local_pki_lays_out_ca_server_and_clients_with_private_keys(tmp_path: Path) -> None:
    pki = ensure_local_pki(tmp_path / "pki", ["localhost", "127.0.0.1"], clients=["alice"])
    for pair in (pki.ca, pki.server, pki.clients["alice"]):
        assert stat.S_IMODE(pair.key.stat().st_mode) == 0o600
        assert pair.cert.is_file()
    ca, server, alice = _cert(pki.ca.cert), _cert(pki.server.cert), _cert(pki.clients["alice"].cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    server.verify_directly_issued_by(ca)
    alice.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    usage = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert alice.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    usage = alice.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_local_pki_reuses_its_files_and_reissues_what_no_longer_fits(tmp_path: Path) -> None:
    first = ensure_local_pki(tmp_path, ["localhost"], clients=["alice"])
    before = {p: p.read_bytes() for pair in (first.ca, first.server) for p in (pair.cert, pair.key)}
    again = ensure_local_pki(tmp_path, ["localhost"], clients=["alice", "bob"])
    assert {p: p.read_bytes() for p in before} == before  # nothing rewritten
    assert set(again.clients) == {"alice", "bob"}
    # A host the server certificate lacks: a new server certificate, same CA.
    wider = ensure_local_pki(tmp_path, ["localhost", "broker.example"])
    assert wider.server.cert.read_bytes() != before[first.server.cert]
    assert wider.ca.cert.read_bytes() == before[first.ca.cert]
    # A CA that is gone: everything under it is issued again.
    first.ca.key.unlink()
    renewed = ensure_local_pki(tmp_path, ["localhost"], clients=["alice"])
    _cert(renewed.server.cert).verify_directly_issued_by(_cert(renewed.ca.cert))
    _cert(renewed.clients["alice"].cert).verify_directly_issued_by(_cert(renewed.ca.cert))


def test_local_pki_refuses_names_that_are_not_names(tmp_path: Path) -> None:
    with pytest.raises(PkiError):
        ensure_local_pki(tmp_path, ["localhost"], clients=["../escape"])
    pki = ensure_local_pki(tmp_path, ["localhost"])
    with pytest.raises(PkiError):
        issue_server_cert(pki.ca, CertPaths(tmp_path / "s.pem", tmp_path / "s.key"), ["a b"])
    assert not (tmp_path / "s.pem").exists()


def test_principal_is_the_common_name_else_the_first_alt_name() -> None:
    cn = {"subject": ((("organizationName", "x"),), (("commonName", "alice"),))}
    assert principal_of_peercert(cn) == "alice"
    san = {"subject": (), "subjectAltName": (("DNS", "svc.local"), ("URI", "spiffe://d/svc"))}
    assert principal_of_peercert(san) == "spiffe://d/svc"
    assert principal_of_peercert({}) is None
    assert principal_of_peercert(None) is None


def test_file_watch_reports_each_change_once_and_no_faster_than_its_interval(
    tmp_path: Path,
) -> None:
    now = [0.0]
    path = tmp_path / "cert.pem"
    path.write_text("one")
    watch = FileWatch([path], interval_s=5.0, clock=lambda: now[0])
    path.write_text("two, longer")
    assert watch.changed() is False  # not looked at before the interval
    now[0] = 5.0
    assert watch.changed() is True
    now[0] = 10.0
    assert watch.changed() is False  # the same change is reported once
    path.unlink()
    now[0] = 15.0
    assert watch.changed() is True  # gone (being replaced) counts as a change
