// Peer for bench/webhooks: a GitHub webhook receiver the way most people
// write one in Node.js, on @octokit/webhooks (the core of Probot).
//
//   node server.js PORT SECRET_FILE
//
// One process, one event loop, like a normal Probot app (no cluster).
// POST /webhooks/github: read the raw body, then the same call Probot's
// createNodeMiddleware makes, webhooks.verifyAndReceive(), which checks
// X-Hub-Signature-256 with @octokit/webhooks-methods, parses the JSON and
// runs the registered handlers. 202 {"accepted":true} when the signature
// holds, 401 when it does not. Nothing is stored: this peer does less work
// than diverged (no durability), so it flatters Node, not us.
import { readFileSync } from "node:fs";
import http from "node:http";
import { Webhooks } from "@octokit/webhooks";

const BODY_MAX = 5 * 1024 * 1024;
const PATH = "/webhooks/github";

const [port, secretFile] = process.argv.slice(2);
if (!port || !secretFile) {
  console.error("usage: node server.js PORT SECRET_FILE");
  process.exit(2);
}
const secret = readFileSync(secretFile, "utf8").replace(/\r?\n$/, "");
if (!secret) {
  console.error(`node-receiver: secret '${secretFile}' is empty`);
  process.exit(1);
}

const webhooks = new Webhooks({ secret });

// What a Probot app does with a comment: look for a command. Kept cheap so
// the benchmark measures the intake path, not application logic.
let commands = 0;
webhooks.on("issue_comment.created", ({ payload }) => {
  if (payload.issue.pull_request && /^\/diverge\b/m.test(payload.comment.body))
    commands++;
});
webhooks.onError(() => {});

function send(res, status, body) {
  const data = JSON.stringify(body) + "\n";
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(data),
  });
  res.end(data);
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let len = 0;
    req.on("data", (chunk) => {
      len += chunk.length;
      if (len > BODY_MAX) {
        reject(Object.assign(new Error("body too large"), { status: 413 }));
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on("end", () => resolve(Buffer.concat(chunks, len).toString("utf8")));
    req.on("error", reject);
  });
}

const server = http.createServer(async (req, res) => {
  if (req.url.split("?")[0] !== PATH)
    return send(res, 404, { error: "not found" });
  if (req.method !== "POST")
    return send(res, 405, { error: "method not allowed" });
  const name = req.headers["x-github-event"];
  const id = req.headers["x-github-delivery"];
  const signature = req.headers["x-hub-signature-256"];
  if (!name || !id)
    return send(res, 400, { error: "missing event headers" });
  if (!signature)
    return send(res, 401, { error: "missing signature" });
  let payload;
  try {
    payload = await readBody(req);
  } catch (err) {
    return send(res, err.status || 400, { error: err.message });
  }
  try {
    await webhooks.verifyAndReceive({ id, name, payload, signature });
  } catch (err) {
    const first = err.errors ? err.errors[0] : err;
    if (/signature does not match/.test(first.message))
      return send(res, 401, { error: "bad signature" });
    return send(res, first.status || 500, { error: first.message });
  }
  send(res, 202, { accepted: true, delivery: id });
});

server.listen(Number(port), "127.0.0.1", () => {
  console.log("listening");
});

for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => {
    server.close();
    server.closeAllConnections();
    console.error(`node-receiver: ${commands} commands seen`);
    process.exit(0);
  });
}
