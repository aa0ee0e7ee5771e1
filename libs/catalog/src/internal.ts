// What the mesh's own services share of the catalog beyond its public face: the stored shape of
// quotas and of their usage, which the resolver's gate counts against.
export {
  decodeStoredQuota,
  decodeUsage,
  emptyUsage,
  openQuotaBucket,
  quotaBucketSpecs,
  utcDay,
} from "./quota-store.js";
export type { StoredQuota, Usage, UsageEntry } from "./quota-store.js";
