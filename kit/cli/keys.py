"""`kit keys new`: a key pair to sign runs and builds with (kit run/build --sign-key, kit verify --key)."""

from __future__ import annotations

from pathlib import Path

import click

from kit.cli._output import emit_json
from kit.evidence.signing import ECDSA_P256, KEY_TYPE_CHOICES, write_key_pair

VERIFIERS = {"ecdsa-p256": ["kit verify --key", "DSSE / in-toto verifiers (securesystemslib, in-toto)",
                            "model_signing verify key"],
             "ed25519": ["kit verify --key", "DSSE / in-toto verifiers (securesystemslib, in-toto)"]}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def command():
    """Make signing keys.

    \b
    Examples:
      kit keys new keys/lab-seal
      kit keys new --help
    """


@command.command("new", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("name", type=click.Path(path_type=Path))
@click.option("--type", "kind", type=click.Choice(list(KEY_TYPE_CHOICES)), default="ecdsa-p256", show_default=True,
              help="ecdsa-p256 is checked by every standard verifier, model_signing's key mode included; ed25519 by "
                   "kit verify and DSSE/in-toto verifiers (model_signing takes no ed25519 key).")
@click.option("--force", is_flag=True, help="Replace an existing NAME.pem / NAME.pub (a key may have signed evidence).")
@click.option("--json", "as_json", is_flag=True, help="Print one rlk-kit/key-pair/v1 document.")
def new(name: Path, kind: str, force: bool, as_json: bool):
    """Write a new key pair: NAME.pem (private, PKCS#8 PEM, mode 0600) and NAME.pub (public, PEM).

    Sign with the private key (kit run --sign-key NAME.pem, kit build --sign-key NAME.pem); give the
    public key to whoever checks the evidence (kit verify --key NAME.pub; model_signing verify key
    --public_key NAME.pub for an ECDSA P-256 key). An existing pair is never replaced without --force.
    Exit 0 written, 2 bad NAME (exists, unwritable).

    \b
    Examples:
      kit keys new keys/seal-p256
      kit keys new --type ed25519 --json keys/seal-ed25519
    """
    private, public, keyid = write_key_pair(name, kind, force=force)
    algorithm = KEY_TYPE_CHOICES[kind]
    if as_json:
        emit_json({"schema": "rlk-kit/key-pair/v1", "type": kind, "algorithm": algorithm, "private_key": str(private),
                   "public_key": str(public), "keyid": keyid, "verified_by": VERIFIERS[kind]})
        return
    click.echo(f"private key  {private}  (keep it; sign with --sign-key {private})")
    click.echo(f"public key   {public}  (give it out; kit verify --key {public})")
    click.echo(f"type         {'ECDSA P-256 (SHA-256)' if algorithm == ECDSA_P256 else 'ed25519'}, keyid {keyid[:16]}")
    click.echo(f"verified by  {'; '.join(VERIFIERS[kind])}")
