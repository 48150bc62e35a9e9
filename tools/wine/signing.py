"""The Authenticode check of the Windows CPython's binaries, offline.

Each binary the Python Software Foundation builds into a Windows CPython
(python.exe, python3XX.dll, python3.dll, the extension modules and DLLs of
DLLs/) carries an Authenticode signature. Debian's ``osslsigncode verify``
checks one, and this module accepts a file only when:

- the file's Authenticode digest is the one its signature covers (a byte
  changed anywhere outside the signature fails this);
- the signer's certificate names the Python Software Foundation (O= and
  CN=);
- that certificate leads up to one of the two roots of signing-roots.pem,
  whose fingerprints are pinned below, at the time the signature's
  timestamp gives, and the timestamp's own certificate leads up to one of
  them too. The time matters: the signing certificates are long expired
  (the Foundation's DigiCert one in January 2025; Trusted Signing's live
  three days), so a chain checked at today's date fails; a signature
  without a timestamp is refused for that reason.

What is not checked, and why: revocation. The certificates' revocation
lists sit on the certificate authorities' servers; fetching them needs the
network, which these checks must not (CI may have only the package index).
osslsigncode 2.9 fetches them unless told not to (``-ignore-crl``, passed
where the installed osslsigncode knows it); 2.5 (Debian 12's) never does.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
import shutil
import subprocess

from .config import Refused

HERE = os.path.dirname(os.path.abspath(__file__))
#: the only root certificates a signature may lead up to
ROOTS = os.path.join(HERE, "signing-roots.pem")
#: SHA-256 of each certificate of ROOTS (of its DER form); the file is
#: refused if it holds any other
ROOT_FINGERPRINTS = {
    "552f7bdcf1a7af9e6ce672017f4f12abf77240c78e761ac203d1d9d20ac89988":
        "DigiCert Trusted Root G4",
    "5367f20c7ade0e2bca790915056d086b720c33c1fa2a2661acf787e3292e1270":
        "Microsoft Identity Verification Root Certificate Authority 2020",
}
#: the organisation a signer's certificate must name, as O= and as CN=
SIGNER = "Python Software Foundation"
#: seconds one osslsigncode run may take (it reads one file, offline)
VERIFY_TIMEOUT = 60


def sha256_file(path: str) -> str:
    """The file's SHA-256, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pem_fingerprints(path: str) -> list:
    """SHA-256 (hex) of each certificate of a PEM file, in order."""
    with open(path, encoding="ascii") as f:
        text = f.read()
    bodies = re.findall(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----",
                        text, re.S)
    return [hashlib.sha256(base64.b64decode("".join(body.split()))).hexdigest()
            for body in bodies]


def check_roots(path: str | None = None) -> None:
    """Refuse a roots file (ROOTS by default) that is not exactly the pinned
    certificates."""
    path = path or ROOTS
    found = pem_fingerprints(path)
    if sorted(found) != sorted(ROOT_FINGERPRINTS):
        raise Refused(f"{path}: its certificates' SHA-256 fingerprints {found} are not the "
                      f"pinned roots {sorted(ROOT_FINGERPRINTS)}: refused")


def osslsigncode() -> str:
    """The osslsigncode program (Debian's package: tools/wine/apt.py installs it)."""
    path = shutil.which("osslsigncode")
    if path is None:
        raise SystemExit("osslsigncode is missing, and the Windows CPython's signatures are "
                         "checked with it before it runs: apt-get install -y osslsigncode")
    return path


@functools.cache
def _knows_option(tool: str, option: str) -> bool:
    proc = subprocess.run([tool, "-h"], capture_output=True, text=True, errors="replace",
                          timeout=VERIFY_TIMEOUT)
    return re.search(rf"\[\s*{re.escape(option)}\b", proc.stdout + proc.stderr) is not None


def verify_command(tool: str, path: str, roots: str) -> list:
    """``osslsigncode verify`` of one file against ``roots`` only, offline."""
    cmd = [tool, "verify", "-CAfile", roots, "-TSA-CAfile", roots]
    if _knows_option(tool, "-ignore-crl"):
        # Without it osslsigncode 2.9 fetches each certificate's revocation
        # list over the network, and fails the check offline.
        cmd.append("-ignore-crl")
    return [*cmd, "-in", path]


def _subject_fields(subject: str) -> dict:
    """{"O": ..., "CN": ...} of osslsigncode's "/C=US/O=.../CN=..." form."""
    fields = {}
    for part in subject.strip().split("/"):
        key, sep, value = part.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def signer_subjects(report: str) -> list:
    """The subject of each signature's signer in osslsigncode's report: the
    first Subject line after each "Signer's certificate:" line."""
    subjects = []
    waiting = False
    for line in report.splitlines():
        stripped = line.strip()
        if stripped.startswith("Signer's certificate:"):
            waiting = True
        elif waiting and stripped.startswith("Subject:"):
            subjects.append(stripped[len("Subject:"):].strip())
            waiting = False
    return subjects


def judge(returncode: int, report: str) -> str | None:
    """What is wrong with a file, from osslsigncode verify's exit status and
    its output (stdout and stderr together); None when nothing is."""
    if "No signature found" in report:
        return "it carries no Authenticode signature"
    if "Signature Index" not in report:
        last = [line.strip() for line in report.splitlines() if line.strip()][-1:]
        return f"osslsigncode could not read a signature in it ({' '.join(last)})"
    if re.search(r"Calculated message digest.*MISMATCH", report):
        return ("its contents do not match the digest its signature covers: "
                "it was changed after it was signed")
    subjects = signer_subjects(report)
    if not subjects:
        return "osslsigncode names no signer for its signature"
    for subject in subjects:
        fields = _subject_fields(subject)
        if fields.get("O") != SIGNER or fields.get("CN") != SIGNER:
            return f"its signer is {subject}, not the {SIGNER}"
    lines = [line.strip() for line in report.splitlines() if line.strip()]
    if returncode != 0 or "Succeeded" not in lines:
        errors = sorted({match.strip() for match in
                         re.findall(r"(?:Verify error|Error): *([^\n]+)", report)})
        if "Timestamp is not available" in report:
            errors.append("no timestamp: its expired certificate cannot be checked at "
                          "signing time")
        return ("its signature does not lead up to a pinned root certificate ("
                + ("; ".join(errors) or f"osslsigncode exited {returncode}") + ")")
    return None


def signature_problem(path: str, roots: str | None = None) -> str | None:
    """Why ``path`` is not a binary signed by the Python Software Foundation
    under one of ``roots`` (ROOTS by default), or None when it is (see the
    module's docstring)."""
    cmd = verify_command(osslsigncode(), path, roots or ROOTS)
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                          timeout=VERIFY_TIMEOUT)
    return judge(proc.returncode, proc.stdout + "\n" + proc.stderr)


def signed_binaries(folder: str, tag: str) -> list:
    """The paths, relative to ``folder``, of the binaries the Python Software
    Foundation signs in a Windows CPython whose tag is ``tag`` (cp311):
    python.exe and python3XX.dll must be there. Not listed, because another
    publisher signs them or none does: the Visual C++ runtime DLLs
    (Microsoft's), and the launchers pip, setuptools and Tcl ship."""
    required = ["python.exe", f"python{tag[2:]}.dll"]
    missing = [name for name in required if not os.path.isfile(os.path.join(folder, name))]
    if missing:
        raise Refused(f"{folder} has no {' or '.join(missing)}: refused")
    names = list(required)
    names += [name for name in ("pythonw.exe", "python3.dll")
              if os.path.isfile(os.path.join(folder, name))]
    dlls = os.path.join(folder, "DLLs")
    if os.path.isdir(dlls):
        names += [f"DLLs/{name}" for name in sorted(os.listdir(dlls))
                  if name.lower().endswith((".pyd", ".dll"))]
    return names


def verify_binaries(folder: str, names) -> dict:
    """Check each binary's signature under ROOTS; {name: its SHA-256} when
    every one passes, else Refused naming each that failed and why."""
    check_roots()
    problems = []
    digests = {}
    for name in names:
        path = os.path.join(folder, name)
        problem = signature_problem(path)
        if problem:
            problems.append(f"{path}: {problem}")
        else:
            digests[name] = sha256_file(path)
    if problems:
        raise Refused("the Windows CPython's binaries failed their Authenticode check, so "
                      "it does not run:\n  " + "\n  ".join(problems))
    return digests
