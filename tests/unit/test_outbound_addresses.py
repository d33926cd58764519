"""Property tests of where a webhook may go: only globally routable addresses, whatever IPv6
form carries them, and a refusal never tells the caller what a name resolved to."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobcore.execution.completion_webhooks import (
    NAT64_LOCAL_USE,
    CallbackHostUnresolved,
    IPAddress,
    NonPublicCallbackAddress,
    check_callback_url,
    is_public,
    unwrap,
)
from tests.support.resolver import resolving_to

EXAMPLES = settings(max_examples=300, deadline=None)

ipv4 = st.ip_addresses(v=4)
# Addresses from the special-purpose networks (hypothesis draws these often) and anywhere.
any_address: st.SearchStrategy[IPAddress] = st.ip_addresses()


def mapped(v4: ipaddress.IPv4Address) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + v4.packed)


def sixtofour(v4: ipaddress.IPv4Address, rest: bytes) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(b"\x20\x02" + v4.packed + rest)


def nat64(v4: ipaddress.IPv4Address) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(b"\0\x64\xff\x9b" + b"\0" * 8 + v4.packed)


local_use_nat64 = st.integers(0, 2**80 - 1).map(
    lambda low: ipaddress.IPv6Address(int(NAT64_LOCAL_USE.network_address) | low)
)
wrapped = st.one_of(
    ipv4.map(mapped),
    st.tuples(ipv4, st.binary(min_size=10, max_size=10)).map(lambda t: sixtofour(*t)),
    ipv4.map(nat64),
    local_use_nat64,
)
addresses = st.one_of(any_address, wrapped)
hostnames = st.from_regex(r"\A[a-z][a-z0-9-]{0,15}(\.[a-z][a-z0-9-]{0,10}){1,3}\Z")


def spellings(address: IPAddress) -> set[str]:
    """Ways an address could appear in a message."""
    texts = {str(address), address.exploded}
    for reached in unwrap(address):
        texts |= {str(reached), reached.exploded}
    return texts


@EXAMPLES
@given(addresses)
def test_an_address_is_public_only_if_all_it_reaches_is_global(address: IPAddress) -> None:
    if not all(reached.is_global for reached in unwrap(address)):
        assert not is_public(address)
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        assert not is_public(address)
    if is_public(address):
        assert all(reached.is_global and not reached.is_multicast for reached in unwrap(address))


@EXAMPLES
@given(ipv4, st.binary(min_size=10, max_size=10))
def test_ipv6_forms_of_an_ipv4_address_are_judged_as_that_address(
    v4: ipaddress.IPv4Address, rest: bytes
) -> None:
    assert is_public(mapped(v4)) is is_public(nat64(v4)) is is_public(sixtofour(v4, rest))
    assert is_public(nat64(v4)) is is_public(v4)


@EXAMPLES
@given(local_use_nat64)
def test_a_local_use_nat64_address_is_public_only_in_every_rfc6052_reading(
    address: ipaddress.IPv6Address,
) -> None:
    readings = unwrap(address)
    assert len(readings) == 4
    assert readings[-1] == ipaddress.IPv4Address(address.packed[12:])  # the /96 format
    assert is_public(address) is all(is_public(reading) for reading in readings)


@EXAMPLES
@given(hostnames, st.lists(addresses, min_size=1, max_size=3), ipv4)
async def test_a_name_resolving_to_any_non_public_address_is_refused_without_saying_so(
    host: str, found: list[IPAddress], public: ipaddress.IPv4Address
) -> None:
    url = f"https://{host}/hooks/jobs"
    with resolving_to(found) as asked:
        if all(map(is_public, found)):
            _, connect_to = await check_callback_url(url, [])
            assert connect_to == list(dict.fromkeys(found))
            return
        with pytest.raises(NonPublicCallbackAddress) as refused:
            await check_callback_url(url, [])
    assert asked == [host]
    message = str(refused.value)
    assert "refused" in message
    assert host not in message
    for address in found:
        assert not any(text in message for text in spellings(address))


@EXAMPLES
@given(any_address.filter(lambda a: not is_public(a)), st.booleans())
async def test_a_public_address_does_not_launder_a_non_public_one(
    internal: IPAddress, internal_first: bool
) -> None:
    public = ipaddress.ip_address("93.184.216.34")
    found = [internal, public] if internal_first else [public, internal]
    with resolving_to(found), pytest.raises(NonPublicCallbackAddress):
        await check_callback_url("http://rebind.example/x", [])


async def test_the_resolvers_error_text_is_not_passed_on() -> None:
    failure = socket.gaierror(socket.EAI_NONAME, "Name or service not known: resolver-detail")
    with resolving_to(failure), pytest.raises(CallbackHostUnresolved) as refused:
        await check_callback_url("http://nowhere.example/x", [])
    assert "resolver-detail" not in str(refused.value)
    assert "nowhere.example" not in str(refused.value)
    assert str(refused.value) == "The callback URL was refused: its host does not resolve."
