// The example of the resolver's source document: a geometry optimisation whose model call
// gives three arguments and whose schema fills the rest from defaults.
export default {
  name: "optimize_structure",
  progress: true,
  description:
    "Perform geometry optimization of a crystal structure with a DPA model. Returns the relaxed energy and the number of steps.",
  groups: ["materials"],
  timeoutMs: 10_000,
  parameters: {
    type: "object",
    required: ["input_structure", "model_path"],
    properties: {
      input_structure: { type: "string", description: "Input structure file URL or path" },
      model_path: { type: "string", description: "Path to the DPA model file" },
      head: { type: "string", description: "Model head type", default: "Omat24" },
      force_tolerance: {
        type: "number",
        description: "Force convergence tolerance",
        default: 0.01,
      },
      max_iterations: {
        type: "integer",
        description: "Maximum optimization iterations",
        default: 100,
      },
      relax_cell: {
        type: "boolean",
        description: "Whether to relax cell parameters",
        default: false,
      },
      executor: { type: "object", description: "Executor configuration" },
      storage: { type: "object", description: "Storage configuration" },
    },
  },
  async handler(args, ctx) {
    const steps = Math.min(args.max_iterations, 5);
    for (let step = 1; step <= steps; step++) {
      if (ctx.signal.aborted) throw ctx.signal.reason;
      ctx.emit({ step, of: steps });
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    return {
      structure: args.input_structure,
      head: args.head,
      relax_cell: args.relax_cell,
      steps,
      converged: true,
      energy_ev: -3.7412 * (args.force_tolerance > 0.05 ? 0.99 : 1),
    };
  },
};
