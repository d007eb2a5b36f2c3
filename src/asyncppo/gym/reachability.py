"""Is a gym server there? One cheap HTTP request per URL, and a bounded wait for servers that are still starting.

`trainer/gym_setup.py` (`wait_for_external_gym`) calls `wait_until_reachable` before a run with an external gym
starts anything, with each configured URL under its config key:

    {key: url} --probe: GET url (any HTTP answer counts, a 401 or 404 too)--> every one answers: return
        --some do not--> one line each (key, URL, why) --probe again every poll_s--> all answer: one line each
                                                       --timeout_s passed--> GymUnreachableError (all still silent)
"""

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

PROBE_TIMEOUT_S = 5.0
"""Longest wait for one probe's answer: a server that is up answers a GET at once."""
POLL_S = 1.0
"""Seconds between rounds of probes while waiting."""


@dataclass(frozen=True)
class SilentURL:
    """A configured URL that gave no HTTP answer, under its config key, with why (one line)."""

    key: str
    url: str
    reason: str
    malformed: bool = False
    """No server could ever answer it (no http:// or https:// scheme, not a URL)."""


class GymUnreachableError(Exception):
    """Configured gym URLs that gave no HTTP answer: after `waited_s` seconds, or at once for a URL that can never
    answer (no http:// or https:// scheme, not a URL)."""

    def __init__(self, silent: list[SilentURL], waited_s: float) -> None:
        super().__init__("; ".join(f"{url.key}: {url.url} ({url.reason})" for url in silent))
        self.silent = silent
        self.waited_s = waited_s


class MalformedURLError(ValueError):
    """The URL cannot be requested at all: waiting would not change that."""


def probe(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when an HTTP server answers `GET url` within `timeout_s`, whatever its status; else why not (one line).

    MalformedURLError for a URL that no server could ever answer (no http:// or https:// scheme, not a URL)."""
    try:
        httpx.get(url, timeout=timeout_s)
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as error:
        raise MalformedURLError(str(error)) from None
    except httpx.TransportError as error:  # refused, timed out, no such host, dropped: nothing answers there yet
        return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return None


def wait_until_reachable(
    urls: Mapping[str, str],
    timeout_s: float,
    *,
    timeout_key: str,
    say: Callable[[str], None],
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once every URL (config key -> URL) answers an HTTP request; GymUnreachableError naming those still
    silent after `timeout_s` seconds (0: no wait), or at once for a malformed one. `say` gets one line per silent URL
    when the wait starts (naming `timeout_key`, the setting of the wait) and one per URL that answers later."""
    started = clock()
    silent: dict[str, SilentURL] = {}
    for key, url in urls.items():
        try:
            reason = probe(url)
        except MalformedURLError as error:
            raise GymUnreachableError([SilentURL(key, url, str(error), malformed=True)], 0.0) from None
        if reason is not None:
            silent[key] = SilentURL(key, url, reason)
    if silent and timeout_s > 0:
        for url in silent.values():
            waiting = f"waiting up to {timeout_s:g} s ({timeout_key})"
            say(f"gym: {url.key} {url.url} does not answer ({url.reason}); {waiting}")
    while silent:
        remaining = timeout_s - (clock() - started)
        if remaining <= 0:
            raise GymUnreachableError(list(silent.values()), clock() - started)
        sleep(min(poll_s, remaining))
        for key, url in list(silent.items()):
            reason = probe(url.url, min(PROBE_TIMEOUT_S, max(remaining, poll_s)))
            if reason is None:
                del silent[key]
                say(f"gym: {key} {url.url} answers (after {clock() - started:.1f} s)")
            else:
                silent[key] = SilentURL(key, url.url, reason)
