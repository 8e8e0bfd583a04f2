"""What the unmodified WhisperLiveKit client (0.2.26) does when the replica holding its session drains,
behind HAProxy: it drops the update that got `processing_failed`, finds its socket closed at the next
`process()`, waits its first backoff (1 s), and opens a new session through the balancer, on the
other replica, with the text it showed as `accepted_target_prefix`; the final then extends that
text. No retraction, nothing lost; translation pauses for about the backoff."""

import importlib
import time

import pytest

from alignatt.measure.replicas import Balancer, ReplicasOptions
from tests.support.server_client import fake_server, needs_haproxy

pytestmark = [
    needs_haproxy,
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning"),  # the WLK client's call
]


def _tokens(timed, words: list[str], start: int) -> list:
    return [timed.ASRToken(start=0.4 * (start + i), end=0.4 * (start + i) + 0.4, text=" " + w)
            for i, w in enumerate(words)]


def test_the_whisperlivekit_client_resumes_on_another_replica_when_its_replica_drains(tmp_path):
    from alignatt.replay.wlk_client import load_wlk_client

    wlk = load_wlk_client()
    timed = importlib.import_module("whisperlivekit.timed_objects")
    with fake_server(tmp_path) as a, fake_server(tmp_path) as b:
        balancer = Balancer(ReplicasOptions(check_interval_ms=100), [a.server.port, b.server.port], tmp_path)
        try:
            balancer.wait_up(2)
            client = wlk.AlignAttRemoteEngine(url=f"ws://127.0.0.1:{balancer.port}", source_language="en",
                                              preset=None, latency="balanced").new_session("de")
            client.insert_tokens(_tokens(timed, "the causal encoder processes".split(), 0))
            client.process()
            shown = client._emitted_partial
            assert shown  # a partial translation is shown
            holder, other = (a, b) if a.server.connections else (b, a)
            holder.server.config.drain_s = 0.2  # the utterance stays open: its session is handed over
            drained_at = time.monotonic()
            holder.drain()
            client.insert_tokens(_tokens(timed, "each block once.".split(), 4))
            segment, resumed_at = None, None
            while segment is None and time.monotonic() - drained_at < 15:
                segment, _ = client.process()
                if resumed_at is None and other.server.session_log and client._ws is not None:
                    resumed_at = time.monotonic()
                time.sleep(0.05)
        finally:
            balancer.stop()
        inits = list(other.server.session_log)
    assert segment is not None and segment.text.startswith(shown)  # the final extends what was shown
    assert [i["accepted_target_prefix"] for i in inits] == [shown]  # one new session, seeded with it
    assert 0.9 <= resumed_at - drained_at <= 5.0  # its first backoff is 1 s
