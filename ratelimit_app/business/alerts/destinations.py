"""Where webhooks may go: public addresses only, unless WEBHOOK_ALLOWED_NETWORKS names the network.

Whoever may edit endpoints in the admin could otherwise point one at the app's own network
(loopback, private ranges, the cloud's link-local metadata service) and read the answers'
status codes and errors off the deliveries' list: a port scanner. So a URL's host is resolved,
every address it resolves to is checked, and the sender connects to the checked address itself
(never resolving the name again), so a name whose DNS changes after the admin's check is caught
at delivery time. A refused address never gets a connection.
"""

import ipaddress
import socket

__all__ = ["RefusedDestination", "allowed_networks", "address_problem", "resolve_checked",
           "url_problem"]


class RefusedDestination(ValueError):
    """The URL's host is, or resolves to, an address webhooks are not sent to."""


def allowed_networks(config):
    """Return WEBHOOK_ALLOWED_NETWORKS as networks (entries that are not one are left out: system
    check ratelimit_app.E013 names them)."""
    networks = []
    for entry in config["WEBHOOK_ALLOWED_NETWORKS"] or ():
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except (TypeError, ValueError):
            continue
    return tuple(networks)


def address_problem(address, networks):
    """Return why webhooks may not go to ``address`` (a string), in words ("a loopback
    address"), or None if they may: a public address, or one inside ``networks``."""
    ip = ipaddress.ip_address(address)
    if ip.version == 6 and ip.ipv4_mapped:  # ::ffff:127.0.0.1 is 127.0.0.1
        ip = ip.ipv4_mapped
    if any(ip.version == network.version and ip in network for network in networks):
        return None
    for kind, flag in (("a loopback", ip.is_loopback), ("a link-local", ip.is_link_local),
                       ("a multicast", ip.is_multicast), ("a private", ip.is_private)):
        if flag:
            return f"{kind} address"
    return None if ip.is_global else "a reserved address"


def resolve_checked(host, port, networks, resolve=socket.getaddrinfo):
    """Return the ``(family, sockaddr)`` pairs to connect to for ``host``:``port``, every one
    checked. Raises RefusedDestination if any address is refused (none is connected to), and
    OSError if the name does not resolve."""
    found = resolve(host, port, type=socket.SOCK_STREAM)
    targets = []
    for family, _type, _proto, _name, sockaddr in found:
        problem = address_problem(sockaddr[0], networks)
        if problem:
            verb = "is" if host == sockaddr[0] else "resolves to"
            raise RefusedDestination(
                f"{host} {verb} {problem}: webhooks go to public addresses only, unless "
                f"RATELIMIT_APP['WEBHOOK_ALLOWED_NETWORKS'] names its network")
        targets.append((family, sockaddr))
    return targets


def url_problem(host, config, resolve=socket.getaddrinfo):
    """Return why an endpoint may not point at ``host`` (the admin's form error), or None. A
    name that does not resolve now is not refused here: the sender checks again when it
    delivers."""
    try:
        resolve_checked(host, 0, allowed_networks(config), resolve)
    except RefusedDestination as refused:
        return str(refused)
    except (OSError, UnicodeError):
        return None
    return None
