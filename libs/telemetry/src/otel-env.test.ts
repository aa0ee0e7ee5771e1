import { describe, expect, it } from "vitest";
import { serviceNameOf } from "./otel-env.js";

describe("service name", () => {
  const serviceName = "toolmesh-resolver";

  it("is the role's name when nothing else is set", () => {
    expect(serviceNameOf({ serviceName, env: {} })).toBe("toolmesh-resolver");
  });

  it("takes service.name from OTEL_RESOURCE_ATTRIBUTES over the role's name", () => {
    const env = { OTEL_RESOURCE_ATTRIBUTES: "service.name=calls-frontdoor,team=agents" };
    expect(serviceNameOf({ serviceName, env })).toBe("calls-frontdoor");
  });

  it("takes OTEL_SERVICE_NAME over both", () => {
    const env = {
      OTEL_SERVICE_NAME: "resolver-eu",
      OTEL_RESOURCE_ATTRIBUTES: "service.name=calls-frontdoor",
    };
    expect(serviceNameOf({ serviceName, env })).toBe("resolver-eu");
  });

  it("ignores a blank OTEL_SERVICE_NAME", () => {
    expect(serviceNameOf({ serviceName, env: { OTEL_SERVICE_NAME: "  " } })).toBe(serviceName);
  });
});
