// round-robin.mjs — a fetch for the SDKs that sends each request to the
// next of BASE_URLS (comma-separated; scheme, host and port taken, the
// request's path kept): replicas of one store behind a round-robin
// balancer with no sticky sessions (tests/gateway/replicas.sh). Without
// BASE_URLS, the SDK's URL as it is. A client makes its own at each run
// (host.mjs loads this module once, and a run's environment is its own).
export function roundRobin() {
  const replicas = (process.env.BASE_URLS || '').split(',').filter(Boolean).map((u) => new URL(u));
  let next = 0;
  return (url, init) => {
    if (!replicas.length) return fetch(url, init);
    const u = new URL(String(url)), to = replicas[next++ % replicas.length];
    u.protocol = to.protocol;
    u.host = to.host;
    return fetch(u, init);
  };
}
