"""How deliveries travel (business/alerts/transport.py, destinations.py, the Sender's pool):
WEBHOOK_TIMEOUT_S bounds the whole exchange against a real receiver that dribbles its answer's
headers; one slow receiver does not hold the other endpoints' deliveries; loopback, private and
link-local addresses are refused in the admin and again after resolving at delivery time, and a
refused address never gets a connection."""

import json
import socket
import time

import pytest
from django.core.checks import Error

from ratelimit_app.business.alerts.destinations import address_problem, allowed_networks
from ratelimit_app.business.alerts.models import WebhookDelivery, WebhookEndpoint
from ratelimit_app.business.alerts.webhooks import Sender, first_attempt_times
from ratelimit_app.operations.system_checks import check_webhook_networks

from .webhook_receiver import DribblingReceiver, Receiver

pytestmark = pytest.mark.django_db


def outbox(url, name="receiver", count=1):
    """An endpoint at ``url`` (saved without the admin's check) with ``count`` due deliveries."""
    endpoint = WebhookEndpoint.objects.create(name=name, url=url)
    next_at, give_up_at = first_attempt_times()
    for n in range(count):
        WebhookDelivery.objects.create(endpoint=endpoint, event="quota.exhausted",
                                       body=json.dumps({"type": "quota.exhausted", "n": n}),
                                       next_attempt_at=next_at, give_up_at=give_up_at)
    return endpoint


def webhook_settings(settings, **values):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, **values}


@pytest.fixture
def dribbler():
    receiver = DribblingReceiver(interval_s=0.1).start()
    yield receiver
    receiver.stop()


class Listener:
    """A listening socket on 127.0.0.1 that accepts nothing by itself: ``connected()`` says
    whether anyone connected to it."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]

    def connected(self):
        self.socket.setblocking(False)
        try:
            self.socket.accept()[0].close()
        except BlockingIOError:
            return False
        return True


@pytest.fixture
def listener():
    listening = Listener()
    yield listening
    listening.socket.close()


def resolving_to(address):
    """A resolver (``socket.getaddrinfo``'s shape) that answers ``address`` for every name: what
    the DNS of a name says after it changed."""
    def resolve(host, port, type=0, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]
    return resolve


# --- the whole exchange within WEBHOOK_TIMEOUT_S ----------------------------------------------

def test_a_receiver_that_dribbles_its_headers_is_cut_at_the_timeout_and_retried_later(
        settings, dribbler):
    webhook_settings(settings, WEBHOOK_TIMEOUT_S=0.5)
    outbox(dribbler.url)
    started = time.monotonic()
    assert Sender().send_due() == (0, 1)
    took_s = time.monotonic() - started
    # each header line came within 0.1 s, so only a bound on the whole exchange ends it
    assert 0.5 <= took_s < 2.0
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, None)
    assert delivery.last_error == ("TimeoutError: timed out: no whole answer within "
                                   "WEBHOOK_TIMEOUT_S (0.5 s)")

    # nothing lost: once the receiver answers, the retry (past its backoff) is delivered
    dribbler.dribble = False
    assert Sender(clock=lambda: time.time() + 11).send_due() == (1, 0)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("sent", 2, 200)


def test_one_slow_receiver_does_not_hold_the_other_endpoints_deliveries(settings, dribbler):
    webhook_settings(settings, WEBHOOK_TIMEOUT_S=30, WEBHOOK_CONCURRENCY=2,
                     WEBHOOK_POLL_INTERVAL_S=0.05)
    fast = Receiver().start()
    try:
        outbox(dribbler.url, name="slow", count=3)  # claimed first: the oldest rows
        outbox(fast.url, name="fast", count=3)
        outbox(fast.url.replace("/hooks/", "/other/"), name="also fast", count=2)
        seen, most_in_flight = [], [0]
        deadline = time.monotonic() + 20

        def on_round(counts):
            statuses = dict(WebhookDelivery.objects.filter(status="sending").values_list(
                "endpoint__name", "status"))
            most_in_flight[0] = max(most_in_flight[0], len(statuses))
            pending = WebhookDelivery.objects.exclude(endpoint__name="slow") \
                .exclude(status="sent").count()
            if pending == 0 or time.monotonic() > deadline:
                seen.append(statuses.get("slow"))
                stop.set()
                dribbler.stop()  # the slow POST ends now (the receiver hangs up)

        import threading

        stop = threading.Event()
        Sender().run(stop, on_round=on_round)
    finally:
        fast.stop()
    # every other delivery was sent while the slow receiver still held its first one
    assert seen == ["sending"]
    assert len(fast.received) == 5
    assert dribbler.connections == 1  # one delivery per endpoint at a time
    assert most_in_flight[0] <= 2  # claimed only for the pool's idle threads
    slow = WebhookDelivery.objects.filter(endpoint__name="slow")
    assert sorted(slow.values_list("status", "attempts")) == [("pending", 0), ("pending", 0),
                                                              ("pending", 1)]
    assert "closed the connection" in slow.get(attempts=1).last_error


# --- addresses that are not public --------------------------------------------------------------

@pytest.mark.parametrize("address, problem", [
    ("127.0.0.1", "a loopback address"),
    ("::1", "a loopback address"),
    ("::ffff:127.0.0.1", "a loopback address"),
    ("10.1.2.3", "a private address"),
    ("192.168.0.10", "a private address"),
    ("169.254.169.254", "a link-local address"),  # the cloud's metadata service
    ("fe80::1", "a link-local address"),
    ("0.0.0.0", "a private address"),
    ("100.64.0.1", "a reserved address"),
    ("224.0.0.1", "a multicast address"),
    ("93.184.216.34", None),
    ("2606:2800:220:1:248:1893:25c8:1946", None),
])
def test_which_addresses_are_refused(address, problem):
    assert address_problem(address, ()) == problem


def test_a_network_allowed_in_the_settings_is_not_refused():
    networks = allowed_networks({"WEBHOOK_ALLOWED_NETWORKS": ["10.20.0.0/16", "::1/128", "junk"]})
    assert address_problem("10.20.3.4", networks) is None
    assert address_problem("::1", networks) is None
    assert address_problem("10.21.0.1", networks) == "a private address"
    assert address_problem("127.0.0.1", networks) == "a loopback address"


@pytest.mark.parametrize("url, refused", [
    ("http://127.0.0.1:8000/hooks", "127.0.0.1 is a loopback address"),
    ("http://localhost/hooks", "localhost resolves to a loopback address"),
    ("https://10.0.0.7/hooks", "10.0.0.7 is a private address"),
    ("http://169.254.169.254/latest/meta-data", "169.254.169.254 is a link-local address"),
    ("http://[::1]:9000/", "::1 is a loopback address"),
    ("https://93.184.216.34/hooks", None),  # a public address: no connection is made here
])
def test_the_model_refuses_urls_pointing_at_addresses_that_are_not_public(settings, url, refused):
    from django.core.exceptions import ValidationError

    webhook_settings(settings, WEBHOOK_ALLOWED_NETWORKS=[])
    endpoint = WebhookEndpoint(name="x", url=url)
    if refused is None:
        endpoint.full_clean()
        return
    with pytest.raises(ValidationError) as error:
        endpoint.full_clean()
    [message] = error.value.message_dict["url"]
    assert message.startswith(refused) and "WEBHOOK_ALLOWED_NETWORKS" in message

    webhook_settings(settings, WEBHOOK_ALLOWED_NETWORKS=["127.0.0.0/8", "::1/128", "10.0.0.0/8",
                                                         "169.254.0.0/16"])
    endpoint.full_clean()  # allowed


def test_the_admin_form_says_why_a_private_url_is_refused(settings, admin_client):
    webhook_settings(settings, WEBHOOK_ALLOWED_NETWORKS=[])
    response = admin_client.post("/admin/ratelimit_alerts/webhookendpoint/add/", {
        "name": "inside", "url": "http://10.9.8.7/hooks", "events": ["quota.exhausted"],
        "signature_scheme": "standard", "enabled": "on"})
    assert response.status_code == 200  # the form again, with its error
    assert "10.9.8.7 is a private address" in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_a_name_whose_dns_now_says_loopback_is_refused_at_delivery_and_never_connected(
        settings, listener):
    webhook_settings(settings, WEBHOOK_ALLOWED_NETWORKS=[])
    # the admin saw a name that resolved elsewhere (here: to nothing it could check)
    endpoint = WebhookEndpoint(name="rebinding", url=f"http://hooks.example.test:{listener.port}/")
    endpoint.full_clean()
    endpoint.save()
    next_at, give_up_at = first_attempt_times()
    WebhookDelivery.objects.create(endpoint=endpoint, event="quota.exhausted", body="{}",
                                   next_attempt_at=next_at, give_up_at=give_up_at)
    assert Sender(resolve=resolving_to("127.0.0.1")).send_due() == (0, 1)
    delivery = WebhookDelivery.objects.get()
    assert delivery.last_status_code is None
    assert delivery.last_error.startswith(
        "RefusedDestination: hooks.example.test resolves to a loopback address")
    assert delivery.status == "pending"  # retried as any failure: the setting may change
    assert not listener.connected()


def test_a_loopback_url_saved_without_the_admin_is_refused_and_never_connected(
        settings, listener):
    webhook_settings(settings, WEBHOOK_ALLOWED_NETWORKS=[])
    outbox(f"http://127.0.0.1:{listener.port}/")
    assert Sender().send_due() == (0, 1)
    assert WebhookDelivery.objects.get().last_error.startswith(
        "RefusedDestination: 127.0.0.1 is a loopback address")
    assert not listener.connected()


def test_an_allowed_network_is_connected_to_the_address_that_was_checked(settings, receiver):
    webhook_settings(settings, WEBHOOK_ALLOWED_NETWORKS=["127.0.0.1/32"])
    # a name no DNS knows: reached through the checked address, never resolved again
    outbox(receiver.url.replace("127.0.0.1", "hooks.example.test"))
    assert Sender(resolve=resolving_to("127.0.0.1")).send_due() == (1, 0)
    [got] = receiver.received
    assert got.headers["Host"] == f"hooks.example.test:{receiver.port}"


def test_a_setting_that_is_not_a_list_of_networks_is_a_system_check_error(settings):
    webhook_settings(settings, WEBHOOK_ALLOWED_NETWORKS=["10.0.0.0/8", "intranet"])
    [error] = check_webhook_networks()
    assert isinstance(error, Error) and error.id == "ratelimit_app.E013"
    assert "'intranet'" in error.msg
    webhook_settings(settings, WEBHOOK_ALLOWED_NETWORKS="10.0.0.0/8")
    assert [e.id for e in check_webhook_networks()] == ["ratelimit_app.E013"]
    webhook_settings(settings, WEBHOOK_ALLOWED_NETWORKS=["10.0.0.0/8"])
    assert check_webhook_networks() == []


def test_an_https_receiver_that_never_finishes_its_handshake_is_cut_at_the_timeout(
        settings, listener):
    webhook_settings(settings, WEBHOOK_TIMEOUT_S=0.3)
    outbox(f"https://127.0.0.1:{listener.port}/")  # accepted by the kernel, never answered
    started = time.monotonic()
    assert Sender().send_due() == (0, 1)
    assert time.monotonic() - started < 2
    assert WebhookDelivery.objects.get().last_error.startswith("TimeoutError: timed out")


def test_an_answer_that_is_not_http_is_a_failed_attempt(settings):
    import threading

    server = socket.create_server(("127.0.0.1", 0))

    def answer_garbage():
        connection, _ = server.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    try:
        outbox(f"http://127.0.0.1:{server.getsockname()[1]}/")
        assert Sender().send_due() == (0, 1)
    finally:
        thread.join(5)
        server.close()
    delivery = WebhookDelivery.objects.get()
    assert delivery.last_error == "ConnectionError: not an HTTP answer: b'SSH-2.0-OpenSSH'"
    assert delivery.last_status_code is None


def test_a_path_outside_ascii_is_sent_percent_encoded(receiver):
    outbox(receiver.url + "alertes/données?équipe=ops&x=%2F")
    assert Sender().send_due() == (1, 0)
    assert receiver.received[0].path == "/hooks/alertes/donn%C3%A9es?%C3%A9quipe=ops&x=%2F"
