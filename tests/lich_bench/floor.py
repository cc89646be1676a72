"""The lich side's floor: a bare requests.Session, the environment ignored
and its connection kept alive, posting the same ack to a lich back to back.

    python -m lich_bench.floor PORT N      (the token in LICH_TOKEN)

It runs in a process of its own, as the daemon does, and prints one JSON
line: the median round trip and the rate.
"""
from __future__ import annotations

import json
import os
import sys
from urllib.parse import quote

import requests

from lich_control import CONTRACT_RELEASE
from .common import CLOCK, floor_figures


def main(argv=None) -> int:
    port, n = (int(arg) for arg in (argv if argv is not None else sys.argv[1:]))
    session = requests.Session()
    session.trust_env = False
    url = f"http://127.0.0.1:{port}/mod/acks?token={quote(os.environ['LICH_TOKEN'], safe='')}"
    headers = {"Content-Type": "application/json", "X-Lich-Plugin": CONTRACT_RELEASE}
    body = json.dumps({"session_id": "floor", "id": "floor", "kind": "model", "ok": True}).encode()
    took = []
    for _ in range(n + 1):  # the first opens the connection and is not counted
        start = CLOCK()
        try:
            answer = session.post(url, data=body, headers=headers, timeout=(3.0, 10.0))
        except requests.RequestException as exc:
            # Its text names the URL, and so the token: the type says enough.
            print(f"the ack to lich failed ({type(exc).__name__})", file=sys.stderr)
            return 1
        took.append((CLOCK() - start) * 1000)
        if answer.status_code != 204:
            print(f"lich answered {answer.status_code}", file=sys.stderr)
            return 1
    print(json.dumps(floor_figures(took[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
