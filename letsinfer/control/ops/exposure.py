"""`exposure status`, `enable` and `disable` from a controller: the report
the CLI on the main prints (letsinfer.exposure.report), with the running
node's TLS port read on its gateway's loop, and the changes the CLI on the
main makes (letsinfer.exposure.publishing), which the running node applies
on that loop before the answer (a failure puts the previous settings back).

Publishing is an administrator's. A certificate and key from a controller
come as text in the body over mutual TLS (its workstation's files), bounded,
checked on the main (they parse, the key matches, the certificate is valid
now and a server's) and stored where the cluster CA's go; the key is never
said back or logged. Renewing is sending them again."""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from letsinfer.config import ConfigError
from letsinfer.control.ops.answers import ExposureDisabled, ExposureEnabled, ExposureShown
from letsinfer.control.ops.context import OpsContext
from letsinfer.control.ops.listing import SceneFacts
from letsinfer.exposure import publishing
from letsinfer.exposure.certificate import MAX_PEM
from letsinfer.exposure.report import exposure_report
from letsinfer.exposure.settings import ExposureSettingsError
from letsinfer.trust.peer import Peer


class ExposureEnable(BaseModel):
    """`exposure enable`'s options; ``cert_pem``/``key_pem`` with
    ``cluster_ca`` false (``cert_file``/``key_file``: where the workstation
    read them, as refusals name them), else ``sans``."""

    model_config = ConfigDict(extra="forbid")
    port: int = Field(443, ge=1, le=65535)
    sources: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=64, description="CIDR networks; none: anywhere"
    )
    address: str = Field("0.0.0.0", min_length=1, max_length=64)
    plain: Literal["lan", "off"] = "lan"
    cluster_ca: bool = False
    sans: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=list, max_length=32
    )
    cert_pem: str | None = Field(None, max_length=MAX_PEM)
    key_pem: SecretStr | None = Field(
        None, max_length=MAX_PEM, description="PEM, unencrypted; never said back"
    )
    cert_file: str = Field("(sent)", min_length=1, max_length=4096)
    key_file: str = Field("(sent)", min_length=1, max_length=4096)


def exposure_router(ops: OpsContext, facts: SceneFacts | None) -> APIRouter:
    router = APIRouter(tags=["state"])
    # The running node serves the exposure file now (None: no node runs
    # beside this plane; it is published at its next start).
    apply = ops.apply_exposure

    @router.get("/v1/ops/exposure")
    async def exposure_status(p: Annotated[Peer, ops.need("viewer")]) -> ExposureShown:
        """What is published beyond the LAN, to whom, the certificate and
        whether the running node serves it (node: null, no node runs)."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no home to read the exposure from")
        node: dict[str, Any] | None = None
        if facts is not None:
            _, _, node = await facts()
        try:
            report = exposure_report(ops.home, ops.identity, node)
        except ExposureSettingsError as exc:
            raise HTTPException(409, str(exc)) from exc
        return ExposureShown.model_validate(report)

    @router.post("/v1/ops/exposure/enable", tags=["exposure"])
    async def exposure_enable(
        body: ExposureEnable, p: Annotated[Peer, ops.need("administrator")]
    ) -> ExposureEnabled:
        """Publish the inference plane over TLS on one port to the listed
        sources, with the certificate sent or one the cluster CA issues."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no home to publish from")
        home = ops.home
        try:
            has_cert, has_key = body.cert_pem is not None, body.key_pem is not None
            publishing.check_choice(body.cluster_ca, has_cert, has_key, bool(body.sans))
            pair = None  # --cluster-ca
            if body.cert_pem is not None and body.key_pem is not None:
                pair = publishing.SentPair(
                    body.cert_pem.encode(),
                    body.key_pem.get_secret_value().encode(),
                    body.cert_file,
                    body.key_file,
                )
            wanted = publishing.Wanted(
                body.port, tuple(body.sources), body.address, body.plain, tuple(body.sans)
            )
            staged = publishing.stage(home, ops.identity, wanted, pair)
        except publishing.PublishRefused as exc:
            raise HTTPException(exc.status, str(exc)) from exc
        except ConfigError as exc:  # (the main's own settings: said as on the main)
            raise HTTPException(409, f"{exc}. Nothing changed.") from exc
        if apply is not None:
            state = await apply()
            if state.get("error"):
                publishing.restore(home, staged.previous)
                why = f"the running node could not publish it: {state['error']}"
                raise HTTPException(409, f"{why}. Nothing changed.")
        said = publishing.enabled(home, ops.identity, staged, node_serving=apply is not None)
        ops.store.append_audit(
            ops.actor(p),
            "exposure.enable",
            "ok",
            role=p.identity.role,
            target=said["url"],
            detail=publishing.audit_detail(staged),
        )
        return ExposureEnabled.model_validate(said)

    @router.post("/v1/ops/exposure/disable", tags=["exposure"])
    async def exposure_disable(p: Annotated[Peer, ops.need("administrator")]) -> ExposureDisabled:
        """Close the TLS port; the inference plane serves the LAN only again
        (closed: false, nothing was published)."""
        if ops.home is None:
            raise HTTPException(503, "this plane has no home to publish from")
        closed, previous = publishing.unpublish(ops.home)
        if closed and apply is not None:
            await apply()
        ops.store.append_audit(
            ops.actor(p),
            "exposure.disable",
            "ok",
            role=p.identity.role,
            target="exposure",
            detail=None if closed else "nothing was published",
        )
        return ExposureDisabled.model_validate(
            publishing.disabled(closed, previous, node_running=apply is not None)
        )

    return router
