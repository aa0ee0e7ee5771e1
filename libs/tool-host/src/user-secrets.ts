import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";
import type { NatsConnection } from "@nats-io/nats-core";
import { Kvm } from "@nats-io/kv";
import type { KV } from "@nats-io/kv";
import type { JetStreamManager } from "@nats-io/jetstream";
import { jetstreamManager } from "@nats-io/jetstream";
import { z } from "zod";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import type { CallerIdentity, Subjects } from "@toolmesh/protocol";
import { scanBucket } from "@toolmesh/nats";

const KEY_BYTES = 32;
const IV_BYTES = 12;

/** A sealed secret as stored: AES-256-GCM under key `kid`, base64 fields. */
const SealedSchema = z.strictObject({
  v: z.literal(1),
  kid: z.string().min(1),
  iv: z.string(),
  tag: z.string(),
  ct: z.string(),
});

/**
 * AES-256-GCM sealing with a key ring: seals under the current key, opens under whichever key
 * id a sealed value names, so keys rotate by adding a new current key and resealing. The
 * associated data binds a sealed value to where it is stored: moved to another key, it does
 * not open.
 */
export class SecretBox {
  readonly #keys: ReadonlyMap<string, Buffer>;
  /** The id of the key new values are sealed under. */
  readonly currentKeyId: string;

  private constructor(keys: ReadonlyMap<string, Buffer>, current: string) {
    this.#keys = keys;
    this.currentKeyId = current;
  }

  /**
   * Parses `kid:base64key[,kid:base64key…]`, the first key current (each 32 bytes); throws a
   * message naming `variable` when malformed.
   */
  static fromKeyList(list: string, variable: string): SecretBox {
    const keys = new Map<string, Buffer>();
    let current: string | undefined;
    for (const part of list.split(",")) {
      const at = part.indexOf(":");
      const kid = part.slice(0, at).trim();
      const key = Buffer.from(part.slice(at + 1).trim(), "base64");
      if (at <= 0 || !/^[A-Za-z0-9_-]{1,64}$/.test(kid) || key.length !== KEY_BYTES)
        throw new Error(
          `${variable}: each entry must be <key id>:<32 bytes in base64> (openssl rand -base64 32), comma-separated`,
        );
      if (keys.has(kid)) throw new Error(`${variable}: key id ${kid} appears twice`);
      keys.set(kid, key);
      current ??= kid;
    }
    return new SecretBox(keys, current as string);
  }

  /** Seals `plaintext` bound to `binding` (the storage key). */
  seal(plaintext: string, binding: string): string {
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv("aes-256-gcm", this.#keys.get(this.currentKeyId) as Buffer, iv);
    cipher.setAAD(Buffer.from(binding, "utf8"));
    const ct = Buffer.concat([cipher.update(plaintext, "utf8"), cipher.final()]);
    return JSON.stringify({
      v: 1,
      kid: this.currentKeyId,
      iv: iv.toString("base64"),
      tag: cipher.getAuthTag().toString("base64"),
      ct: ct.toString("base64"),
    });
  }

  /** Opens a sealed value bound to `binding`; throws when the key is unknown or it was altered. */
  open(sealed: string, binding: string): string {
    const parsed = SealedSchema.parse(JSON.parse(sealed));
    const key = this.#keys.get(parsed.kid);
    if (key === undefined)
      throw new Error(`sealed under key ${parsed.kid}, which is not configured`);
    const decipher = createDecipheriv("aes-256-gcm", key, Buffer.from(parsed.iv, "base64"));
    decipher.setAAD(Buffer.from(binding, "utf8"));
    decipher.setAuthTag(Buffer.from(parsed.tag, "base64"));
    return Buffer.concat([
      decipher.update(Buffer.from(parsed.ct, "base64")),
      decipher.final(),
    ]).toString("utf8");
  }

  /** The key id a sealed value names. */
  static keyIdOf(sealed: string): string {
    return SealedSchema.parse(JSON.parse(sealed)).kid;
  }
}

/**
 * Where the bucket of users' secrets comes from when it is missing: `toolmesh setup` makes the
 * mesh account's; in a tool owner's account its operator (`toolmesh secrets`) or its first
 * executor or bridge of such tools makes it, with `replicas` (default 1).
 */
export interface UserSecretsBucketOptions {
  create?: boolean;
  replicas?: number | undefined;
}

/** The KV bucket `subjects.userSecretsBucket` of the account `nc` is in. */
export async function openUserSecretsBucket(
  nc: NatsConnection,
  subjects: Subjects,
  options: UserSecretsBucketOptions = {},
): Promise<KV> {
  const kvm = new Kvm(nc);
  return options.create === true
    ? await kvm.create(subjects.userSecretsBucket, {
        history: 1,
        replicas: options.replicas ?? 1,
      })
    : await kvm.open(subjects.userSecretsBucket);
}

/** Users' secrets for tools in the KV bucket `subjects.userSecretsBucket`, sealed. */
export class UserSecretStore {
  readonly #kv: KV;
  readonly #jsm: JetStreamManager;
  readonly #box: SecretBox;
  readonly #subjects: Subjects;

  private constructor(kv: KV, jsm: JetStreamManager, box: SecretBox, subjects: Subjects) {
    this.#kv = kv;
    this.#jsm = jsm;
    this.#box = box;
    this.#subjects = subjects;
  }

  /** Opens the bucket (see {@link UserSecretsBucketOptions}). */
  static async open(
    nc: NatsConnection,
    subjects: Subjects,
    box: SecretBox,
    options: UserSecretsBucketOptions = {},
  ): Promise<UserSecretStore> {
    const kv = await openUserSecretsBucket(nc, subjects, options);
    return new UserSecretStore(kv, await jetstreamManager(nc), box, subjects);
  }

  /** Stores (replaces) `subject`'s secret for `tool` in `tenant`. */
  async set(tenant: string, subject: string, tool: string, secret: string): Promise<void> {
    const key = this.#subjects.userSecretKey(tenant, subject, tool);
    await this.#kv.put(key, this.#box.seal(secret, key));
  }

  /** Removes it; false when there was none. */
  async remove(tenant: string, subject: string, tool: string): Promise<boolean> {
    const key = this.#subjects.userSecretKey(tenant, subject, tool);
    const entry = await this.#kv.get(key);
    if (entry === null || entry.operation !== "PUT") return false;
    await this.#kv.delete(key);
    return true;
  }

  /**
   * The tools `subject` stored a secret for in `tenant`, never values. A name too long for a
   * key is listed as its shortened key token.
   */
  async list(tenant: string, subject: string): Promise<string[]> {
    const prefix = this.#subjects.userSecretKey(tenant, subject, "x").slice(0, -1);
    // Message gets, not a key listing: listing fails on nats-server 2.9 while a node is down.
    const stored = await scanBucket(this.#jsm, this.#subjects.userSecretsBucket, `${prefix}*`);
    return stored.map(({ key }) => nameOfToken(key.slice(prefix.length))).sort();
  }

  /**
   * The secret the caller registered for `tool`; `credential_required` when the call names no
   * user or the user has none.
   */
  async secretFor(tool: string, identity: CallerIdentity | undefined): Promise<string> {
    if (identity === undefined)
      throw new ToolmeshError(
        ErrorCode.CredentialRequired,
        `tool "${tool}" acts as the calling user, and the call names no user: call it through the gateway as a signed-in user`,
        { details: { tool, type: "user-secret" } },
      );
    const key = this.#subjects.userSecretKey(identity.tenant, identity.subject, tool);
    const entry = await this.#kv.get(key);
    if (entry === null || entry.operation !== "PUT")
      throw new ToolmeshError(
        ErrorCode.CredentialRequired,
        `no secret of user "${identity.subject}" for tool "${tool}": register one with toolmesh secrets set`,
        { details: { tool, type: "user-secret", subject: identity.subject } },
      );
    try {
      return this.#box.open(entry.string(), key);
    } catch (err) {
      throw new ToolmeshError(
        ErrorCode.CredentialRequired,
        `the secret of user "${identity.subject}" for tool "${tool}" cannot be opened (${(err as Error).message}): register it again`,
        { details: { tool, type: "user-secret", subject: identity.subject } },
      );
    }
  }
}

/**
 * The name a key token of `subjectToken` stands for: its `=XX` escapes turned back into UTF-8
 * bytes. A shortened token (`==` and a digest) or one escaping UTF-16 units (`=u`) is kept.
 */
function nameOfToken(token: string): string {
  if (token.includes("==") || token.includes("=u")) return token;
  const bytes: number[] = [];
  for (let i = 0; i < token.length;) {
    if (token[i] === "=") {
      bytes.push(Number.parseInt(token.slice(i + 1, i + 3), 16));
      i += 3;
    } else {
      bytes.push(token.charCodeAt(i));
      i += 1;
    }
  }
  return Buffer.from(bytes).toString("utf8");
}
