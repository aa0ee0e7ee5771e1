import type { JetStreamManager, PubAck } from "@nats-io/jetstream";
import type { CallStore } from "@toolmesh/call-store";
import { knownRecordOf } from "@toolmesh/call-store";
import type { ResolvedCall } from "@toolmesh/protocol";

/**
 * Whether work the work stream dropped as a duplicate was routed under the record this process
 * created for the call (at `revision`): another delivery of the same call routed it meanwhile —
 * the calls stream can deliver a call again to another resolver while this one holds it for its
 * fair turn — so an executor has it. False when the work was routed before that record existed,
 * under an earlier record that is gone.
 *
 * The duplicate's acknowledgement names the stored work message. While it waits (a work stream
 * keeps work until an executor ends it) its headers name the record it was routed under; once it
 * is gone, the executor that ended it has changed the record since. Throws when the work
 * stream or the record cannot be read now.
 */
export async function routedUnderRecord(
  jsm: JetStreamManager,
  store: Pick<CallStore, "get">,
  call: ResolvedCall,
  ack: PubAck,
  revision: number,
): Promise<boolean> {
  // Null only when the message is gone; a server that cannot answer now (a leader election)
  // throws, and the call is handed back to be looked at again, never taken as gone.
  const original = await jsm.streams.getMessage(ack.stream, { seq: ack.seq });
  if (original !== null) {
    const known = knownRecordOf(call, original.header);
    return known !== undefined && known.revision >= revision;
  }
  const current = await store.get(call);
  return current !== undefined && current.revision > revision;
}
