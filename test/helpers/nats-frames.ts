import { Transform, type TransformCallback } from "node:stream";

const CRLF = Buffer.from("\r\n");

/** A message as the server's `MSG`/`HMSG` line names it. */
export interface Delivered {
  /** Its subject: for a JetStream delivery, the stored message's subject. */
  subject: string;
  /** Its reply subject: `$JS.ACK.…` for a JetStream delivery. */
  reply: string | undefined;
}

/**
 * Passes a server's side of a NATS connection through, frame by frame, leaving out every
 * message (`MSG`, `HMSG`) that `drop` picks: a network path that loses one kind of delivery
 * while everything else (replies, PINGs, INFO) goes on.
 */
export class DeliveryFilter extends Transform {
  readonly #drop: (message: Delivered) => boolean;
  #pending = Buffer.alloc(0);

  constructor(drop: (message: Delivered) => boolean) {
    super();
    this.#drop = drop;
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, done: TransformCallback): void {
    this.#pending = Buffer.concat([this.#pending, chunk]);
    for (;;) {
      const frame = this.#nextFrame();
      if (frame === undefined) break;
      if (!frame.dropped) this.push(frame.bytes);
    }
    done();
  }

  /** The next whole frame at the front of the pending bytes, taken off them. */
  #nextFrame(): { bytes: Buffer; dropped: boolean } | undefined {
    const lineEnd = this.#pending.indexOf(CRLF);
    if (lineEnd < 0) return undefined;
    const line = this.#pending.subarray(0, lineEnd).toString("latin1");
    const args = line.split(" ");
    // MSG <subject> <sid> [reply] <size>; HMSG <subject> <sid> [reply] <header size> <size>
    const sizes = args[0] === "MSG" ? 1 : args[0] === "HMSG" ? 2 : 0;
    const isMessage = sizes > 0;
    const bodyBytes = isMessage ? Number(args.at(-1)) + CRLF.length : 0;
    const length = lineEnd + CRLF.length + bodyBytes;
    if (this.#pending.length < length) return undefined;
    const bytes = this.#pending.subarray(0, length);
    this.#pending = this.#pending.subarray(length);
    const reply = args.length === 3 + sizes + 1 ? args[3] : undefined;
    return { bytes, dropped: isMessage && this.#drop({ subject: args[1] ?? "", reply }) };
  }
}

/**
 * Whether a message comes from a push consumer: a stored message (its reply an acknowledgement
 * subject) or a heartbeat to its delivery subject (`_INBOX.<id>.<serial>`, as nats.js names
 * it), not a request's reply.
 */
export function fromConsumer({ subject, reply }: Delivered): boolean {
  return reply?.startsWith("$JS.ACK.") === true || /^_INBOX\.[^.]+\.\d+$/.test(subject);
}
