import type { KV } from "@nats-io/kv";
import { encodeJson } from "@toolmesh/protocol";
import { isWrongLastSequence } from "./api-codes.js";

/**
 * Reads `key`, decodes it (`decode` gets the stored bytes, or undefined when the key has no
 * value), lets `change` edit the value (false: nothing to write) and writes it back by
 * compare-and-set; when another writer won meanwhile, reads again and starts over. Resolves
 * with the value written and its revision, or undefined when `change` wrote nothing.
 */
export async function modifyKvEntry<T>(
  kv: KV,
  key: string,
  decode: (value: Uint8Array | undefined) => T,
  change: (value: T) => boolean,
): Promise<{ value: T; revision: number } | undefined> {
  for (;;) {
    const entry = await kv.get(key);
    const value = decode(entry?.operation === "PUT" ? entry.value : undefined);
    if (!change(value)) return undefined;
    try {
      const revision =
        entry === null
          ? await kv.create(key, encodeJson(value))
          : await kv.update(key, encodeJson(value), entry.revision);
      return { value, revision };
    } catch (err) {
      if (!isWrongLastSequence(err)) throw err;
    }
  }
}
