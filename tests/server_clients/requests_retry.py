#!/usr/bin/python3
"""POSTs one claim with python-requests, retried by urllib3's own Retry as a client library
retries: 409, 500 and 503 are sent again under the same Idempotency-Key, with backoff.

Usage: requests_retry.py PORT KEY BODY
Prints one JSON line: the final status, its Idempotent-Replayed header, its body, and how many
retries urllib3 made.
"""
import json
import sys

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry


def main():
    port, key, body = sys.argv[1], sys.argv[2], sys.argv[3]
    retry = Retry(
        total=8,
        connect=0,
        read=0,
        status_forcelist=[409, 500, 503],
        allowed_methods=frozenset(["POST"]),
        backoff_factor=0.25,
        respect_retry_after_header=True,
        raise_on_status=False,
    )
    session = requests.Session()
    session.mount("http://", HTTPAdapter(max_retries=retry))
    response = session.post(
        f"http://127.0.0.1:{port}/claims",
        data=body,
        headers={"Idempotency-Key": key, "Content-Type": "application/json", "X-Client": "acme"},
        timeout=10,
    )
    history = response.raw.retries.history if response.raw.retries else ()
    print(json.dumps({
        "status": response.status_code,
        "replayed": response.headers.get("Idempotent-Replayed", ""),
        "body": response.text,
        "retries": len(history),
        "statuses": [h.status for h in history],
    }))


if __name__ == "__main__":
    main()
