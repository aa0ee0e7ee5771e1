import { createHash } from "node:crypto";
import type { FSWatcher } from "node:fs";
import { readFileSync, watch } from "node:fs";
import { basename, dirname } from "node:path";
import type { Logger } from "@toolmesh/telemetry";
import type { Principal } from "./auth.js";
import { loadKeysFile } from "./auth.js";

/** Options of {@link KeysFileWatcher.open}. */
export interface KeysFileWatcherOptions {
  /** Variables the file's `env` entries name. */
  env: Readonly<Record<string, string | undefined>>;
  log?: Logger;
  /**
   * How often the file is also compared by content, in ms, for file systems whose changes are
   * not notified. Default 10 000.
   */
  checkEveryMs?: number;
}

/**
 * The gateway's API keys, read from the keys file and read again whenever it changes, so keys
 * are added and removed without a restart. The folder is watched, not the file: a Kubernetes
 * Secret volume replaces its files by swapping a symlink, which a watch on the old file misses.
 * A file that does not parse keeps the keys in force (and says why in the log): a half-written
 * edit never locks every client out.
 */
export class KeysFileWatcher {
  readonly #path: string;
  readonly #options: KeysFileWatcherOptions;
  #keys: Map<string, Principal>;
  #digest: string;
  #watcher: FSWatcher | undefined;
  #timer: NodeJS.Timeout | undefined;
  #reloading: Promise<void> = Promise.resolve();

  private constructor(
    path: string,
    options: KeysFileWatcherOptions,
    keys: Map<string, Principal>,
    digest: string,
  ) {
    this.#path = path;
    this.#options = options;
    this.#keys = keys;
    this.#digest = digest;
  }

  /** Reads the file (a bad one fails, as at start) and starts watching it. */
  static async open(path: string, options: KeysFileWatcherOptions): Promise<KeysFileWatcher> {
    const digest = contentDigest(path);
    const watcher = new KeysFileWatcher(
      path,
      options,
      await loadKeysFile(path, options.env),
      digest,
    );
    watcher.#start();
    return watcher;
  }

  /** The keys in force: each key's SHA-256 → its principal. */
  current(): Map<string, Principal> {
    return this.#keys;
  }

  /** Stops watching. */
  close(): void {
    this.#watcher?.close();
    clearInterval(this.#timer);
  }

  #start(): void {
    const name = basename(this.#path);
    try {
      this.#watcher = watch(dirname(this.#path), (_event, file) => {
        // `..data` is the symlink a Secret volume swaps; any other name is another file.
        if (file === null || file === name || file.startsWith("..")) this.#check();
      });
      this.#watcher.on("error", () => undefined);
    } catch (err) {
      this.#options.log?.warn(
        { err, file: this.#path },
        "cannot watch the keys file's folder; checking it periodically",
      );
    }
    this.#timer = setInterval(() => this.#check(), this.#options.checkEveryMs ?? 10_000);
    this.#timer.unref();
  }

  /** Reloads when the content changed; one reload at a time, in order. */
  #check(): void {
    this.#reloading = this.#reloading.then(() => this.#reload());
  }

  async #reload(): Promise<void> {
    let digest: string;
    try {
      digest = contentDigest(this.#path);
    } catch {
      return; // briefly absent while it is replaced: the next event or check reads it
    }
    if (digest === this.#digest) return;
    try {
      const keys = await loadKeysFile(this.#path, this.#options.env);
      this.#keys = keys;
      this.#digest = digest;
      this.#options.log?.info({ file: this.#path, keys: keys.size }, "gateway keys reloaded");
    } catch (err) {
      this.#digest = digest; // reported once; a corrected file changes the digest again
      this.#options.log?.warn(
        { err: (err as Error).message, file: this.#path },
        "the keys file changed but cannot be used; the keys in force stay",
      );
    }
  }
}

function contentDigest(path: string): string {
  return createHash("sha256").update(readFileSync(path)).digest("hex");
}
