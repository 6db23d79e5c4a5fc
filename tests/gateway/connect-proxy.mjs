// connect-proxy.mjs — a forward proxy for the gateway's tests (no
// dependencies), as an operator's egress proxy is: CONNECT tunnels (what a
// client asks for an https:// URL through https_proxy) and absolute-form
// requests forwarded (an http:// URL through http_proxy). GET /count
// answers what went through it: {"connect": {"HOST:PORT": n}, "forward":
// {"HOST:PORT": n}}.
//
// Usage: node connect-proxy.mjs PORTFILE   (writes the port it took)
// With PROXY_TLS_CERT and PROXY_TLS_KEY (PEM files) it is an https://
// proxy: a client speaks TLS to the proxy itself, then CONNECT within it.
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import fs from 'node:fs';

const count = { connect: {}, forward: {} };
const bump = (kind, at) => { count[kind][at] = (count[kind][at] || 0) + 1; };

const tls = process.env.PROXY_TLS_CERT && process.env.PROXY_TLS_KEY
  ? { cert: fs.readFileSync(process.env.PROXY_TLS_CERT), key: fs.readFileSync(process.env.PROXY_TLS_KEY) } : null;
const handler = (req, res) => {
  if (req.url === '/count') {
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify(count));
  }
  let u;
  try { u = new URL(req.url); } catch {
    res.writeHead(400, { 'content-type': 'text/plain' });
    return res.end('an absolute URL, or CONNECT');
  }
  bump('forward', u.host);
  const up = http.request({ host: u.hostname, port: u.port || 80, method: req.method, path: u.pathname + u.search,
    headers: req.headers }, (ur) => { res.writeHead(ur.statusCode, ur.headers); ur.pipe(res); });
  up.on('error', () => { res.writeHead(502); res.end(); });
  req.pipe(up);
};
const server = tls ? https.createServer(tls, handler) : http.createServer(handler);

server.on('connect', (req, sock, head) => {
  bump('connect', req.url);
  const [host, port] = req.url.split(':');
  const up = net.connect(Number(port), host, () => {
    sock.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    if (head.length) up.write(head);
    up.pipe(sock);
    sock.pipe(up);
  });
  const drop = () => { up.destroy(); sock.destroy(); };
  up.on('error', drop);
  sock.on('error', drop);
});

server.listen(0, '127.0.0.1', () => fs.writeFileSync(process.argv[2], String(server.address().port)));
