"""``benchmarks.letsinfer_gateway`` with the portal's pages mounted under ``/ui/``
as a main mounts them (``letsinfer.node``: after every gateway route).

    python -m benchmarks.portal_gateway ARGS   # the arguments of benchmarks.letsinfer_gateway

The portal's authority is the gateway's throwaway one (``--home``); nothing
on ``/v1`` reaches it.
"""

from __future__ import annotations

from typing import Any

from benchmarks import letsinfer_gateway as served
from letsinfer.config import PortalSettings
from letsinfer.gateway import app as gateway_app
from letsinfer.gateway.gateway import Gateway
from letsinfer.home import Home


def main() -> None:
    args = served.arguments().parse_args()
    url = f"http://127.0.0.1:{args.port}/v1"

    def with_portal(gw: Gateway, **kwargs: Any) -> Any:
        from letsinfer.portal.pages import Portal  # (as letsinfer.node loads it)

        portal = Portal(Home.under(args.home), PortalSettings(), gw, lambda: url)
        return gateway_app.create_app(gw, portal=portal.app, **kwargs)

    served.create_app = with_portal  # type: ignore[assignment]
    served.main()


if __name__ == "__main__":
    main()
