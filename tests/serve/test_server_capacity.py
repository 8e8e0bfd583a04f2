"""Capacity is counted once (issue 25 item 7): in client sessions, a multi-target session being one.
The engine's scheduler admits what the server admits, and `/health` reports that same count:
it says ok exactly while a new session gets `init_ok`, and full when it would get `busy`."""


from tests.support.server_client import Client, fake_server, health

TARGETS = ["de", "it", "fr", "es"]


def test_four_target_sessions_take_one_place_each_and_health_agrees_with_admission(tmp_path):
    with fake_server(tmp_path, directions=tuple(f"en-{t}" for t in TARGETS), max_sessions=3) as srv:
        multi = [Client(srv.url) for _ in range(2)]
        try:
            for c in multi:
                ok = c.init(target_lang="de", target_langs=TARGETS)
                assert ok["type"] == "init_ok", ok
            status, body = health(srv)
            assert status == 200 and body["status"] == "ok" and body["sessions_active"] == 2
            assert body["sessions_free"] == 1
            engines = srv.call(lambda: [e.stats() for e in srv.server.registry.engines])
            assert [e["sessions"] for e in engines] == [2]  # the engine counts what /health counts
            with Client(srv.url) as third:  # health said ok: it is admitted
                assert third.init()["type"] == "init_ok"
                status, body = health(srv)
                assert status == 503 and body["status"] == "full" and body["sessions_free"] == 0
                with Client(srv.url) as fourth:  # health said full: it is refused
                    assert fourth.init()["code"] == "busy"
            status, body = health(srv)
            assert status == 200 and body["status"] == "ok"
            # Every target of a multi-target session still drafts (one place, four keys).
            replies = []
            multi[0].update(["a", "b"], final=True)
            for _ in TARGETS:
                replies.append(multi[0].recv())
            assert sorted(r["target_lang"] for r in replies) == sorted(TARGETS)
        finally:
            for c in multi:
                c.close()
