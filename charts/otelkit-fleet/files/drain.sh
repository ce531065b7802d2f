#!/bin/sh
# The servers' preStop hook: have the server drain, and return once it has. The container's
# first process is `otelkit fleet serve`, which on SIGTERM leaves the registry (the renderer
# takes it out of Envoy's endpoints), waits for Envoy to let go and for the requests in flight
# to end, then stops Triton and exits. Kubernetes sends its own SIGTERM after this hook: by then
# there is nothing left to stop. (SuperSONIC's hook, ["/bin/sh","-c","touch","/tmp/shutdown;",
# "sleep 60"], ran only `touch`.)
pid="${OTELKIT_SERVE_PID:-1}"
kill -TERM "$pid" 2>/dev/null || exit 0
# until it is gone, or has ended and waits for its parent to reap it (a zombie)
while kill -0 "$pid" 2>/dev/null; do
  state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
  [ "$state" = Z ] && break
  sleep 0.2
done
