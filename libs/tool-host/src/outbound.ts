import type { LookupAddress, LookupAllOptions } from "node:dns";
import { lookup } from "node:dns";
import { BlockList, isIP } from "node:net";
import { Agent, buildConnector, fetch as undiciFetch } from "undici";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";

/**
 * Which private addresses outbound HTTP (native tools, HTTP/SSE MCP servers) may reach
 * (`TOOLMESH_ALLOW_PRIVATE_ADDRESSES`): `true` any, or CIDR ranges / single addresses.
 * Default none: only public addresses.
 */
export type PrivateAddressAllowance = true | readonly string[];

/** Why an outbound connection was refused: the address is private and not allowed. */
export class PrivateAddressError extends Error {
  override readonly name = "PrivateAddressError";
  readonly code = "ERR_TOOLMESH_PRIVATE_ADDRESS";
  constructor(
    readonly host: string,
    readonly address: string,
    readonly range: string,
  ) {
    super(
      `${host === address ? address : `${host} (${address})`} is a ${range} address; allow it with TOOLMESH_ALLOW_PRIVATE_ADDRESSES`,
    );
  }
}

// Ranges no tool may reach unless allowed: loopback, private networks, link-local (cloud
// metadata at 169.254.169.254), carrier-grade NAT, benchmarking, multicast and reserved.
const PRIVATE_RANGES: readonly [string, number, "ipv4" | "ipv6", string][] = [
  ["0.0.0.0", 8, "ipv4", "this-network"],
  ["10.0.0.0", 8, "ipv4", "private"],
  ["100.64.0.0", 10, "ipv4", "carrier-grade NAT"],
  ["127.0.0.0", 8, "ipv4", "loopback"],
  ["169.254.0.0", 16, "ipv4", "link-local"],
  ["172.16.0.0", 12, "ipv4", "private"],
  ["192.0.0.0", 24, "ipv4", "reserved"],
  ["192.168.0.0", 16, "ipv4", "private"],
  ["198.18.0.0", 15, "ipv4", "benchmarking"],
  ["224.0.0.0", 4, "ipv4", "multicast"],
  ["240.0.0.0", 4, "ipv4", "reserved"],
  ["::", 128, "ipv6", "unspecified"],
  ["::1", 128, "ipv6", "loopback"],
  ["fc00::", 7, "ipv6", "private"],
  ["fe80::", 10, "ipv6", "link-local"],
  ["ff00::", 8, "ipv6", "multicast"],
];

const privateRanges = PRIVATE_RANGES.map(([network, prefix, family, label]) => {
  const list = new BlockList();
  list.addSubnet(network, prefix, family);
  return { list, label };
});

/** The IPv4 address an IPv6 address carries (mapped `::ffff:a.b.c.d`, NAT64 `64:ff9b::`). */
function embeddedIpv4(address: string): string | undefined {
  const match =
    /^(?:::ffff:|64:ff9b::)(?:(\d+\.\d+\.\d+\.\d+)|([0-9a-f]{1,4}):([0-9a-f]{1,4}))$/i.exec(
      address,
    );
  if (match === null) return undefined;
  if (match[1] !== undefined) return match[1];
  const hi = Number.parseInt(match[2] ?? "0", 16);
  const lo = Number.parseInt(match[3] ?? "0", 16);
  return [hi >> 8, hi & 255, lo >> 8, lo & 255].join(".");
}

/** The kind of private range `address` is in (`loopback`, `private`, …), or undefined if public. */
export function privateRangeOf(address: string): string | undefined {
  const v4 = isIP(address) === 6 ? embeddedIpv4(address) : undefined;
  const ip = v4 ?? address;
  const family = isIP(ip) === 4 ? "ipv4" : "ipv6";
  return privateRanges.find((r) => r.list.check(ip, family))?.label;
}

/** A compiled allowance: which private addresses may be reached anyway. */
export interface OutboundPolicy {
  /** Throws {@link PrivateAddressError} when `address` (reached as `host`) may not be used. */
  check(host: string, address: string): void;
}

/**
 * Compiles an allowance. Entries are an address (`10.0.0.7`, `::1`) or a CIDR range
 * (`10.1.0.0/16`); anything else is refused with a message naming it.
 */
export function outboundPolicy(allow: PrivateAddressAllowance = []): OutboundPolicy {
  if (allow === true) return { check: () => undefined };
  const allowed = new BlockList();
  for (const entry of allow) {
    const [address = "", prefix] = entry.split("/");
    const family = isIP(address);
    const bits = prefix === undefined ? (family === 4 ? 32 : 128) : Number(prefix);
    if (family === 0 || !Number.isInteger(bits) || bits < 0 || bits > (family === 4 ? 32 : 128)) {
      throw new TypeError(`${entry} is not an IP address or CIDR range`);
    }
    allowed.addSubnet(address, bits, family === 4 ? "ipv4" : "ipv6");
  }
  return {
    check(host, address) {
      const range = privateRangeOf(address);
      if (range === undefined) return;
      const v4 = embeddedIpv4(address);
      const ip = v4 ?? address;
      if (allowed.check(ip, isIP(ip) === 4 ? "ipv4" : "ipv6")) return;
      throw new PrivateAddressError(host, address, range);
    },
  };
}

/** `fetch` as native tools and the MCP SDK call it. */
export type FetchLike = typeof globalThis.fetch;

const DEFAULT_PORTS: Readonly<Record<string, string>> = { "http:": "80", "https:": "443" };

/** `host:port` of a connection: lower-case host without IPv6 brackets, the scheme's default port. */
function hostKey(hostname: string, port: string, protocol: string): string {
  const host = hostname.replace(/^\[(.*)\]$/, "$1").toLowerCase();
  return `${host}:${port === "" ? (DEFAULT_PORTS[protocol] ?? "") : port}`;
}

/**
 * The hosts outbound calls of one operator-configured URL (an MCP server's `url`, an HTTP or
 * OpenAPI tool's base URL) trust: that URL's exact host and port, which the operator wrote and no
 * model argument can change, so connections to it skip the private-address check. Redirects and
 * every other host stay guarded. `trust` is the per-server or per-tool override
 * (`trust_configured_host`); `trustDefault` the process-wide one
 * (`TOOLMESH_TRUST_CONFIGURED_HOSTS`, default true). Returns `[]` when not trusted. A URL whose
 * host a model can fill in must never be passed here.
 */
export function trustedHostsOf(
  url: string | URL,
  trust: boolean | undefined,
  trustDefault = true,
): string[] {
  if (!(trust ?? trustDefault)) return [];
  const parsed = typeof url === "string" ? new URL(url) : url;
  return [hostKey(parsed.hostname, parsed.port, parsed.protocol)];
}

/**
 * A `fetch` whose every connection — the first request, each redirect, each reconnect — is
 * checked on the address it actually connects to, after DNS resolution, so neither a DNS name
 * pointing at a private address nor a redirect to one gets through (nor a name that resolves
 * differently on the second lookup). Connections to `trustedHosts` (from {@link trustedHostsOf},
 * exact `host:port`) are not checked. A refused connection rejects like an unreachable host,
 * with the {@link PrivateAddressError} as the cause (see {@link privateAddressCause}).
 */
export function outboundFetch(
  allow: PrivateAddressAllowance = [],
  trustedHosts: readonly string[] = [],
): FetchLike {
  if (allow === true) return globalThis.fetch;
  const policy = outboundPolicy(allow);
  const trusted = new Set(trustedHosts);
  const guardedLookup = (
    hostname: string,
    options: LookupAllOptions | number | undefined,
    callback: (err: Error | null, address: string | LookupAddress[], family?: number) => void,
  ): void => {
    const opts = typeof options === "number" ? { family: options } : (options ?? {});
    lookup(hostname, { ...opts, all: true }, (err, addresses) => {
      if (err !== null) return callback(err, []);
      try {
        // Refuse the name if any address is private: which one the socket picks is not ours.
        for (const a of addresses) policy.check(hostname, a.address);
      } catch (refused) {
        return callback(refused as Error, []);
      }
      const first = addresses[0];
      if ((opts as { all?: boolean }).all === true) return callback(null, addresses);
      if (first === undefined) return callback(new Error(`${hostname} has no address`), []);
      callback(null, first.address, first.family);
    });
  };
  const connect = buildConnector({ lookup: guardedLookup } as buildConnector.BuildOptions);
  const connectTrusted = trusted.size === 0 ? connect : buildConnector({});
  const agent = new Agent({
    connect(options, callback) {
      if (trusted.has(hostKey(options.hostname, options.port, options.protocol))) {
        connectTrusted(options, callback);
        return;
      }
      // A literal address is connected to without a lookup: check it here.
      const host = options.hostname.replace(/^\[(.*)\]$/, "$1");
      if (isIP(host) !== 0) {
        try {
          policy.check(host, host);
        } catch (refused) {
          callback(refused as Error, null);
          return;
        }
      }
      connect(options, callback);
    },
  });
  return (input, init) =>
    undiciFetch(input as Parameters<typeof undiciFetch>[0], {
      ...(init as Parameters<typeof undiciFetch>[1]),
      dispatcher: agent,
    });
}

/** The {@link PrivateAddressError} behind a failed fetch, if that was why it failed. */
export function privateAddressCause(err: unknown): PrivateAddressError | undefined {
  for (let e: unknown = err, depth = 0; e !== undefined && e !== null && depth < 5; depth++) {
    if (e instanceof PrivateAddressError) return e;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/** The `permission_denied` error a tool call gets when its URL leads to a private address. */
export function privateAddressDenied(
  tool: string,
  origin: string,
  refused: PrivateAddressError,
): ToolmeshError {
  return new ToolmeshError(
    ErrorCode.PermissionDenied,
    `"${tool}" may not call ${origin}: ${refused.message}`,
    {
      retryable: false,
      details: {
        origin,
        address: refused.address,
        range: refused.range,
        reason: "private_address",
      },
    },
  );
}
