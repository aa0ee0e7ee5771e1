import { readFileSync } from "node:fs";

/**
 * A credential file read again each time it is needed (every connection attempt), so a rotated
 * file (a Kubernetes Secret updated in place, a renewed creds file) is used at the next reconnect
 * without a restart. A read that fails — the file briefly missing while it is replaced — answers
 * the last content read, and the next attempt reads again.
 */
export class ReloadingFile {
  readonly #path: string;
  #last: Uint8Array;

  /** `initial` is the content already read (and checked) at start. */
  constructor(path: string, initial: Uint8Array) {
    this.#path = path;
    this.#last = initial;
  }

  /** The file's current content, or the last content read if it cannot be read now. */
  read(): Uint8Array {
    try {
      this.#last = readFileSync(this.#path);
    } catch {
      // Keep the last content: a replaced file may be absent for an instant.
    }
    return this.#last;
  }

  /** The current content as trimmed text (an nkey seed). */
  text(): string {
    return new TextDecoder().decode(this.read()).trim();
  }
}
