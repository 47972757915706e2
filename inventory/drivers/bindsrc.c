/* Local hosts' own source address (LD_PRELOAD; built by inventory/fabric_emulation.py).
 *
 * A real host's connections leave from its own address. On loopback they do not: a socket that
 * connects to 127.0.0.N without binding first gets 127.0.0.1 as its source (the `local` route's
 * preferred source), so no filter could tell which local host sent a packet. Ray, gloo and gRPC
 * connect unbound. This shim binds such a socket to $VOLT_HOST_ADDRESS (port 0) just before
 * connect() when the destination is another 127.x address that is not 127.0.0.1: traffic to
 * 127.0.0.1 (PostgreSQL, Redis, the web server) is left exactly as it was. IPv4 and v4-mapped IPv6.
 *
 * A real host's interface also carries its own address. `lo` carries 127.0.0.1 first, so a program
 * that picks its listening address by interface (gloo with GLOO_SOCKET_IFNAME=lo, NCCL) listened on
 * 127.0.0.1 and its peers' traffic to it passed unshaped: a job's all-reduce ran at loopback speed while
 * the probe, which binds the host's address itself, measured the shaped link (issue 23). getifaddrs()
 * therefore reports `lo`'s 127.0.0.1 as $VOLT_HOST_ADDRESS.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

static int other_loopback(uint32_t address_be) {
    uint32_t address = ntohl(address_be);
    return (address >> 24) == 127 && address != 0x7f000001u;
}

static int unbound(int fd) {
    struct sockaddr_storage own;
    socklen_t length = sizeof own;
    if (getsockname(fd, (struct sockaddr *)&own, &length) != 0) return 0;
    if (own.ss_family == AF_INET) return ((struct sockaddr_in *)&own)->sin_port == 0;
    if (own.ss_family == AF_INET6) return ((struct sockaddr_in6 *)&own)->sin6_port == 0;
    return 0;
}

static void bind_own_address(int fd, const struct sockaddr *to) {
    const char *text = getenv("VOLT_HOST_ADDRESS");
    struct in_addr me;
    if (text == NULL || inet_pton(AF_INET, text, &me) != 1 || !other_loopback(me.s_addr)) return;
    if (to->sa_family == AF_INET) {
        const struct sockaddr_in *peer = (const struct sockaddr_in *)to;
        if (!other_loopback(peer->sin_addr.s_addr) || !unbound(fd)) return;
        struct sockaddr_in local;
        memset(&local, 0, sizeof local);
        local.sin_family = AF_INET;
        local.sin_addr = me;
        bind(fd, (struct sockaddr *)&local, sizeof local); /* on failure connect as before */
    } else if (to->sa_family == AF_INET6) {
        const struct sockaddr_in6 *peer = (const struct sockaddr_in6 *)to;
        uint32_t mapped;
        if (!IN6_IS_ADDR_V4MAPPED(&peer->sin6_addr)) return;
        memcpy(&mapped, &peer->sin6_addr.s6_addr[12], 4);
        if (!other_loopback(mapped) || !unbound(fd)) return;
        struct sockaddr_in6 local;
        memset(&local, 0, sizeof local);
        local.sin6_family = AF_INET6;
        local.sin6_addr.s6_addr[10] = 0xff;
        local.sin6_addr.s6_addr[11] = 0xff;
        memcpy(&local.sin6_addr.s6_addr[12], &me.s_addr, 4);
        bind(fd, (struct sockaddr *)&local, sizeof local);
    }
}

int connect(int fd, const struct sockaddr *to, socklen_t length) {
    static connect_fn real_connect;
    if (real_connect == NULL) real_connect = (connect_fn)dlsym(RTLD_NEXT, "connect");
    if (to != NULL) bind_own_address(fd, to);
    return real_connect(fd, to, length);
}

typedef int (*getifaddrs_fn)(struct ifaddrs **);

int getifaddrs(struct ifaddrs **list) {
    static getifaddrs_fn real_getifaddrs;
    if (real_getifaddrs == NULL) real_getifaddrs = (getifaddrs_fn)dlsym(RTLD_NEXT, "getifaddrs");
    int result = real_getifaddrs(list);
    const char *text = getenv("VOLT_HOST_ADDRESS");
    struct in_addr me;
    if (result != 0 || text == NULL || inet_pton(AF_INET, text, &me) != 1 || !other_loopback(me.s_addr))
        return result;
    for (struct ifaddrs *entry = *list; entry != NULL; entry = entry->ifa_next) {
        if (entry->ifa_addr == NULL || entry->ifa_addr->sa_family != AF_INET) continue;
        struct sockaddr_in *own = (struct sockaddr_in *)entry->ifa_addr;
        if (ntohl(own->sin_addr.s_addr) == 0x7f000001u) own->sin_addr = me;
    }
    return result;
}
