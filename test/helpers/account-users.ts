// The users of an accounts-layout test server: one random password per user, the environment a
// service or the CLI connects with, and connections over TLS that the test closes at the end.
import type { NatsConnection } from "@nats-io/nats-core";
import { connectNats } from "@toolmesh/nats";
import type { NatsConnectOptions } from "@toolmesh/nats";
import type { TestPki } from "./tls.js";

/** Connecting as the users of a test server with TLS and passwords. */
export interface AccountUsers {
  /** The user's password, made on first use. */
  password(user: string): string;
  /** Puts each user's password where a rendered account configuration reads it (its variable). */
  exportPasswords(config: string): void;
  /** The environment (`NATS_*`) a service or the CLI connects as `user` with. */
  credentials(user: string): Record<string, string>;
  /** A connection as `user`, closed by {@link AccountUsers.closeAll}. */
  connectAs(user: string, extra?: NatsConnectOptions): Promise<NatsConnection>;
  /** Closes every connection made by {@link AccountUsers.connectAs}. */
  closeAll(): Promise<void>;
}

/** Users of the server and PKI `where` returns (read when used: both come in `beforeAll`). */
export function accountUsers(where: () => { url: string; pki: TestPki }): AccountUsers {
  const passwords: Record<string, string> = {};
  const open: NatsConnection[] = [];
  const password = (user: string): string =>
    (passwords[user] ??= `pw-${user}-${Math.random().toString(36).slice(2)}`);
  return {
    password,
    exportPasswords(config) {
      for (const m of config.matchAll(/user: "([^"]+)"\n\s+password: \$(\w+)/g))
        process.env[m[2]!] = password(m[1]!);
    },
    credentials(user) {
      const { url, pki } = where();
      return {
        NATS_URL: url,
        NATS_USER: user,
        NATS_PASSWORD: password(user),
        NATS_CA: pki.caFile,
        NATS_CERT: pki.clientCert,
        NATS_KEY: pki.clientKey,
      };
    },
    async connectAs(user, extra = {}) {
      const { url, pki } = where();
      const nc = await connectNats({
        servers: url,
        user,
        password: password(user),
        tlsCa: pki.caFile,
        tlsCert: pki.clientCert,
        tlsKey: pki.clientKey,
        ...extra,
      });
      open.push(nc);
      return nc;
    },
    async closeAll() {
      await Promise.all(open.splice(0).map((nc) => nc.close().catch(() => undefined)));
    },
  };
}

/** A user with every right inside `account`: what the account's imports and exports alone bound. */
export function everyRight(account: string, user: string) {
  return {
    account,
    user,
    permissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } },
  };
}
