// A local receiver for the dashboard's browser tests. Node's http only, no dependency.
//   POST /ok/...        200
//   POST /flaky/...     400 while broken (a non-retryable failure: straight to Failed
//                       Messages), 200 once healed
//   POST /control/heal  heal /flaky; POST /control/break breaks it again
//   GET  /log           what arrived: [{path, status, webhookId}]
// Prints "listening <port>" once it accepts connections.
import http from "node:http";

let broken = true;
const log = [];

const server = http.createServer((req, res) => {
  let size = 0;
  req.on("data", (chunk) => { size += chunk.length; });
  req.on("end", () => {
    const path = req.url || "/";
    const reply = (status, body) => {
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    if (req.method === "GET" && path === "/log") return reply(200, log);
    if (req.method === "POST" && path === "/control/heal") { broken = false; return reply(200, { broken }); }
    if (req.method === "POST" && path === "/control/break") { broken = true; return reply(200, { broken }); }
    let status = 404;
    if (path.startsWith("/ok")) status = 200;
    else if (path.startsWith("/flaky")) status = broken ? 400 : 200;
    log.push({ path, status, webhookId: req.headers["webhook-id"] || null, bytes: size });
    reply(status, status === 200 ? { received: true } : { error: "the receiver refuses this for now" });
  });
});

server.listen(Number(process.env.RECEIVER_PORT || 0), "127.0.0.1", () => {
  console.log(`listening ${server.address().port}`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
