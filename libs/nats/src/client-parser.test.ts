// The NATS client's protocol parser, as patched at install (docs/adr/0065): a message whose
// payload spans several reads is assembled in a buffer sized once from its declared length.
// Every split of a stream of messages must give back each payload exactly.
import { describe, expect, it } from "vitest";
import { Kind, Parser } from "@nats-io/nats-core/internal";
import type { ParserEvent } from "@nats-io/nats-core/internal";

interface Received {
  subject: string;
  reply: string;
  data: Buffer;
}

const te = new TextEncoder();
const td = new TextDecoder();

/** The wire bytes of a MSG (no headers) or an HMSG (with `headers`). */
function wire(subject: string, payload: Uint8Array, headers?: string): Uint8Array {
  const parts: Uint8Array[] = [];
  if (headers === undefined) {
    parts.push(te.encode(`MSG ${subject} 1 _INBOX.r ${payload.length}\r\n`));
  } else {
    const h = te.encode(`NATS/1.0\r\n${headers}\r\n\r\n`);
    parts.push(
      te.encode(`HMSG ${subject} 1 _INBOX.r ${h.length} ${h.length + payload.length}\r\n`),
    );
    parts.push(h);
  }
  parts.push(payload, te.encode("\r\n"));
  return Buffer.concat(parts);
}

/** Feeds `stream` to a parser in reads of `size` bytes; the messages it dispatched, copied. */
function parseInReads(stream: Uint8Array, size: number): Received[] {
  const received: Received[] = [];
  const parser = new Parser({
    push(event: ParserEvent | (() => void)) {
      if (typeof event === "function" || event.kind !== Kind.MSG) return;
      const { msg, data } = event;
      if (msg === undefined || data === undefined) return;
      received.push({
        subject: td.decode(msg.subject),
        reply: td.decode(msg.reply),
        data: Buffer.from(data.subarray(Math.max(0, msg.hdr))),
      });
    },
  });
  for (let at = 0; at < stream.length; at += size) parser.parse(stream.subarray(at, at + size));
  return received;
}

describe("the client's parser", () => {
  const payloads = [0, 1, 100, 70_000, 300_000].map((n) =>
    Buffer.from(Array.from({ length: n }, (_, i) => (i * 7919 + n) % 251)),
  );
  const stream = Buffer.concat([
    ...payloads.map((p, i) => wire(`s.${i}`, p, i % 2 === 0 ? undefined : `K: v${i}`)),
    te.encode("PING\r\n"),
    wire("s.last", te.encode("end")),
  ]);

  it.each([1, 3, 64, 1_000, 65_536, 100_001, stream.length])(
    "gives back every payload exactly when the stream arrives in reads of %i bytes",
    (size) => {
      const received = parseInReads(stream, size);
      expect(received.map((r) => r.subject)).toEqual([
        ...payloads.map((_, i) => `s.${i}`),
        "s.last",
      ]);
      payloads.forEach((p, i) => expect(received[i]?.data.equals(p), `payload ${i}`).toBe(true));
      expect(received.at(-1)?.data.toString()).toBe("end");
      expect(new Set(received.map((r) => r.reply))).toEqual(new Set(["_INBOX.r"]));
    },
  );
});
