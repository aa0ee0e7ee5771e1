// Counts its runs in this process: a call that runs twice answers with a higher count.
let runs = 0;
export default {
  name: "counter",
  description: "Counts how many times it has run.",
  parameters: { type: "object", properties: { label: { type: "string" } } },
  handler({ label }) {
    runs += 1;
    return { label: label ?? null, runs };
  },
};
