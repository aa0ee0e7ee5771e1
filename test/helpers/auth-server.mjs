// A real OAuth 2.0 authorization server (oidc-provider) with the RFC 8693 token-exchange grant,
// an identity provider that signs users' tokens for the gateway, and a protected HTTP API that
// checks the bearer token's subject and audience against the server's JWKS. Runs in a process
// of its own so that its clock can be moved (`POST /admin/clock`) without moving the mesh's.
/* global Buffer */
// Prints one JSON line `{ "url": … }` once it listens.
import { createServer } from "node:http";
import Provider, { errors } from "oidc-provider";
import {
  SignJWT,
  createLocalJWKSet,
  createRemoteJWKSet,
  exportJWK,
  generateKeyPair,
  jwtVerify,
} from "jose";

// The simulated clock: every Date.now() of this process (oidc-provider's and jose's) moves.
const realNow = Date.now.bind(Date);
let offsetMs = 0;
Date.now = () => realNow() + offsetMs;

const TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token";
const REFRESH_TOKEN = "urn:ietf:params:oauth:token-type:refresh_token";
const GATEWAY_AUDIENCE = process.env.GATEWAY_AUDIENCE ?? "https://tools.example.test/mcp";
export const API_AUDIENCE = process.env.API_AUDIENCE ?? "https://api.example.test/";
const CLIENT_ID = process.env.CLIENT_ID ?? "toolmesh";
const CLIENT_SECRET = process.env.CLIENT_SECRET ?? "toolmesh-client-secret";

const idp = await generateKeyPair("ES256");
const idpJwk = { ...(await exportJWK(idp.publicKey)), kid: "idp", alg: "ES256", use: "sig" };
const idpJwks = createLocalJWKSet({ keys: [idpJwk] });
const asKey = await generateKeyPair("RS256", { extractable: true });
const asJwk = { ...(await exportJWK(asKey.privateKey)), kid: "as", alg: "RS256", use: "sig" };

/** Consents: `${sub} ${audience}`; grants issued per subject, destroyed on revocation. */
const consents = new Set();
const grantsOf = new Map();
/** Every token this server or its IdP issued, and what the API saw, for the tests to grep. */
const issued = [];
const apiSaw = [];

const server = createServer();
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const url = `http://127.0.0.1:${server.address().port}`;
const IDP_ISSUER = `${url}/idp`;

const provider = new Provider(url, {
  clients: [
    {
      client_id: CLIENT_ID,
      client_secret: CLIENT_SECRET,
      grant_types: ["refresh_token", TOKEN_EXCHANGE],
      redirect_uris: [],
      response_types: [],
      token_endpoint_auth_method: "client_secret_basic",
    },
  ],
  jwks: { keys: [asJwk] },
  scopes: ["api:read", "offline_access"],
  features: {
    devInteractions: { enabled: false },
    resourceIndicators: {
      enabled: true,
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, resource) => {
        if (resource !== API_AUDIENCE) throw new errors.InvalidTarget();
        return {
          scope: "api:read",
          audience: resource,
          accessTokenTTL: 600,
          accessTokenFormat: "jwt",
        };
      },
    },
  },
  findAccount: (_ctx, id) => ({ accountId: id, claims: () => ({ sub: id }) }),
  rotateRefreshToken: false,
  ttl: { RefreshToken: 14 * 24 * 3600, Grant: 14 * 24 * 3600, AccessToken: 600 },
});

// RFC 8693: a user's IdP token (verified with jose against the IdP's keys) for a refresh token
// for `audience`, when the user consented to it.
provider.registerGrantType(
  TOKEN_EXCHANGE,
  async (ctx) => {
    const { params, client } = ctx.oidc;
    if (params.subject_token_type !== ACCESS_TOKEN)
      throw new errors.InvalidRequest("subject_token_type must be an access token");
    if (params.requested_token_type !== REFRESH_TOKEN)
      throw new errors.InvalidRequest("this server issues refresh tokens by exchange");
    let payload;
    try {
      ({ payload } = await jwtVerify(params.subject_token, idpJwks, {
        issuer: IDP_ISSUER,
        audience: GATEWAY_AUDIENCE,
        currentDate: new Date(Date.now()),
      }));
    } catch (err) {
      throw new errors.InvalidGrant(`subject_token: ${err.code ?? err.message}`);
    }
    const audience = params.audience;
    if (audience !== API_AUDIENCE) throw new errors.InvalidTarget();
    if (!consents.has(`${payload.sub} ${audience}`))
      throw new errors.InvalidGrant("the user has not authorized this audience");
    const grant = new provider.Grant({ accountId: payload.sub, clientId: client.clientId });
    grant.addResourceScope(audience, "api:read");
    const grantId = await grant.save();
    grantsOf.set(payload.sub, [...(grantsOf.get(payload.sub) ?? []), grantId]);
    const refresh = new provider.RefreshToken({
      accountId: payload.sub,
      client,
      grantId,
      scope: "api:read",
      resource: audience,
      gty: "token_exchange",
    });
    const value = await refresh.save();
    issued.push(value);
    ctx.body = { access_token: value, issued_token_type: REFRESH_TOKEN, token_type: "N_A" };
  },
  new Set([
    "subject_token",
    "subject_token_type",
    "requested_token_type",
    "audience",
    "scope",
    "resource",
  ]),
);
provider.on("grant.success", (ctx) => {
  if (typeof ctx.body?.access_token === "string") issued.push(ctx.body.access_token);
});

const asJwks = createRemoteJWKSet(new URL(`${url}/jwks`));
const providerCallback = provider.callback();

async function body(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  return chunks.length === 0 ? {} : JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

function json(res, status, value) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(value));
}

const admin = {
  // A user's token as the IdP signs it for the gateway, valid five minutes.
  async "POST /admin/login"({ sub, tenant }) {
    const jwt = await new SignJWT({ org: tenant, scope: "tools:call" })
      .setProtectedHeader({ alg: "ES256", kid: "idp" })
      .setIssuer(IDP_ISSUER)
      .setAudience(GATEWAY_AUDIENCE)
      .setSubject(sub)
      // On this process's clock, as the authorization server checks it.
      .setIssuedAt(Math.floor(Date.now() / 1000))
      .setExpirationTime(Math.floor(Date.now() / 1000) + 300)
      .sign(idp.privateKey);
    issued.push(jwt);
    return { token: jwt };
  },
  async "POST /admin/consent"({ sub, audience }) {
    consents.add(`${sub} ${audience}`);
    return {};
  },
  // Revokes a user's consent: no new exchange, and every grant issued is destroyed.
  async "POST /admin/revoke"({ sub, audience }) {
    consents.delete(`${sub} ${audience}`);
    for (const id of grantsOf.get(sub) ?? []) await (await provider.Grant.find(id))?.destroy();
    grantsOf.delete(sub);
    return {};
  },
  async "POST /admin/clock"({ advanceMs }) {
    offsetMs += advanceMs;
    return { now: Date.now() };
  },
  async "GET /admin/issued"() {
    return { issued, apiSaw };
  },
};

server.on("request", (req, res) => {
  const path = new URL(req.url, url).pathname;
  const handler = admin[`${req.method} ${path}`];
  if (handler !== undefined) {
    body(req)
      .then((b) => handler(b))
      .then(
        (v) => json(res, 200, v),
        (err) => json(res, 500, { error: String(err) }),
      );
    return;
  }
  if (path === "/idp/jwks") return json(res, 200, { keys: [idpJwk] });
  if (path === "/api/whoami") {
    const token = /^Bearer (.+)$/.exec(req.headers.authorization ?? "")?.[1];
    if (token === undefined) return json(res, 401, { error: "no bearer token" });
    apiSaw.push(token);
    jwtVerify(token, asJwks, {
      issuer: url,
      audience: API_AUDIENCE,
      currentDate: new Date(Date.now()),
    }).then(
      ({ payload }) => json(res, 200, { sub: payload.sub, aud: payload.aud }),
      (err) => json(res, 401, { error: err.code ?? "invalid token" }),
    );
    return;
  }
  providerCallback(req, res);
});

process.stdout.write(`${JSON.stringify({ url, idpIssuer: IDP_ISSUER })}\n`);
