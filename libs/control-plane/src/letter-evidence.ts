import type { CallRecord, CallStore } from "@toolmesh/call-store";
import type { ResolvedCall, Subjects } from "@toolmesh/protocol";
import { subjectToken } from "@toolmesh/protocol";

/** What the mesh's own record says of the call a work-stream dead letter names. */
export type LetterEvidence =
  { status: "recorded"; record: CallRecord } | { status: "suspect"; why: string };

/**
 * Checks a work-stream dead letter against the mesh's record of the call it names (ADR 0051).
 * A letter is evidence written by whoever gave the work up — for a tool owner's stream, the
 * owner itself — so it counts only for a call the mesh really routed to that stream's tool:
 * a record under the call's key, of the same call id, session and tool, and a work subject of
 * that tool in that stream. Anything else names a call its writer never received: shown as
 * suspect and never replayed. (The record holds a hash of the submitted arguments only, not
 * the resolved ones a letter carries, so a letter's arguments cannot be checked; they are those
 * of a call its writer's tool was given.)
 */
export async function letterEvidence(
  store: CallStore,
  subjects: Subjects,
  letter: { stream: string; subject: string },
  call: ResolvedCall,
): Promise<LetterEvidence> {
  const stored = await store.get(call);
  if (stored === undefined) return { status: "suspect", why: "the mesh has no record of its call" };
  const { record } = stored;
  if (
    record.call_id !== call.call_id ||
    record.session_id !== call.session_id ||
    record.tool !== call.tool
  ) {
    return {
      status: "suspect",
      why: `its call key names call ${record.call_id} of tool "${record.tool}", not ${call.call_id} of "${call.tool}"`,
    };
  }
  if (subjects.workStreamOf(letter.subject) !== letter.stream) {
    return {
      status: "suspect",
      why: `it came from ${letter.stream}, which does not hold ${letter.subject}`,
    };
  }
  if (letter.subject.split(".").pop() !== subjectToken(record.tool)) {
    return {
      status: "suspect",
      why: `the mesh routed call ${record.call_id} to another work subject than ${letter.subject}`,
    };
  }
  return { status: "recorded", record };
}
