/* tinkrl bwrap sandbox: a small native pid 1 and a root-side launcher (one binary).
 *
 * Why native: starting Debian's python3 as the sandbox's pid 1 is a large share of a
 * sandbox's start-up time; this program starts almost at once.
 * It speaks exactly the protocol of bwrap_server.py (see that file) and runs exec, write,
 * read, killall and ping itself; the rare tar/untar requests are handed to a one-shot
 * `python3 -I -S bwrap_server.pyc --one` child that gets the request on a pipe.
 *
 *   tinkrl-init SERVER: WORKDIR NPROC MEM_BYTES K=V...   (pid 1 inside the sandbox)
 *   tinkrl-init --launch UID CGROUP_PROCS... -- BWRAP_ARGV...   (on the host, as root)
 *
 * --launch joins the given cgroup.procs files *before* bwrap forks (so every process of
 * the sandbox is born inside its cgroups and nothing has to be moved later), drops all
 * groups and switches to the sandbox's own unprivileged host uid, then execs bwrap.
 *
 * pid 1 is non-dumpable (the agent, same uid, cannot ptrace it or open /proc/1/mem|fd),
 * installs no signal handlers (so the kernel drops every signal the agent sends it) and
 * ignores SIGPIPE itself only; children get default signal dispositions back.
 * Built by tinkrl.sandbox.bwrap.build with `cc -O2 [-static]`; it needs only libc.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STATE_FILE "/run/tinkrl/shell-state"
#define NAMES_FILE "/run/tinkrl/shell-names"
#define SHELL "/bin/bash"
#define HELPER_PYTHON "/usr/bin/python3"
#define HELPER_SERVER "/run/tinkrl-server.pyc"
#define DRAIN_AFTER_EXIT_MS 50
static const char SAVE_STATE[] =
    "__tinkrl_save() { { printf '%s\\0' \"$PWD\"; compgen -e > " NAMES_FILE "; while read -r __v; do "
    "printf '%s=%s\\0' \"$__v\" \"${!__v}\"; done < " NAMES_FILE "; } > " STATE_FILE " 2>/dev/null; }\n"
    "trap __tinkrl_save EXIT\n";

/* ---- small helpers ----------------------------------------------------------------- */
typedef struct { char *p; size_t n, cap; } buf_t;

static void die(const char *what) { perror(what); _exit(125); }

static void buf_add(buf_t *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) die("realloc");
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* read exactly n bytes; 0 ok, -1 EOF/error */
static int read_exact(int fd, char *p, size_t n) {
    while (n) {
        ssize_t r = read(fd, p, n > (1 << 20) ? (1 << 20) : n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* ---- framing ------------------------------------------------------------------------ */
typedef struct { uint32_t count; char **f; uint32_t *len; } frame_t;

static void frame_free(frame_t *fr) {
    for (uint32_t i = 0; i < fr->count; i++) free(fr->f[i]);
    free(fr->f);
    free(fr->len);
    memset(fr, 0, sizeof *fr);
}

static uint32_t be32(const unsigned char *b) { return (uint32_t)b[0] << 24 | b[1] << 16 | b[2] << 8 | b[3]; }

/* Reads one request (each field NUL-terminated for convenience; len[] has the real length). */
static int recv_frame(int fd, frame_t *fr) {
    unsigned char hdr[4];
    memset(fr, 0, sizeof *fr);
    if (read_exact(fd, (char *)hdr, 4)) return -1;
    fr->count = be32(hdr);
    if (fr->count > 64) return -1;
    fr->f = calloc(fr->count ? fr->count : 1, sizeof(char *));
    fr->len = calloc(fr->count ? fr->count : 1, sizeof(uint32_t));
    for (uint32_t i = 0; i < fr->count; i++) {
        if (read_exact(fd, (char *)hdr, 4)) return -1;
        uint32_t n = be32(hdr);
        fr->f[i] = malloc((size_t)n + 1);
        if (!fr->f[i]) die("malloc");
        if (n && read_exact(fd, fr->f[i], n)) return -1;
        fr->f[i][n] = 0;
        fr->len[i] = n;
    }
    return 0;
}

typedef struct { buf_t b; uint32_t count; } reply_t;

static void put_field(reply_t *r, const void *d, size_t n) {
    unsigned char h[4] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8), (unsigned char)n};
    buf_add(&r->b, h, 4);
    if (n) buf_add(&r->b, d, n);
    r->count++;
}
static void put_str(reply_t *r, const char *s) { put_field(r, s, strlen(s)); }
static void put_int(reply_t *r, long v) {
    char s[32];
    snprintf(s, sizeof s, "%ld", v);
    put_str(r, s);
}

static void send_reply(reply_t *r) {
    unsigned char h[4] = {(unsigned char)(r->count >> 24), (unsigned char)(r->count >> 16),
                          (unsigned char)(r->count >> 8), (unsigned char)r->count};
    if (write_all(1, (char *)h, 4) || write_all(1, r->b.p ? r->b.p : "", r->b.n)) _exit(0); /* host gone */
    free(r->b.p);
    memset(r, 0, sizeof *r);
}

static void reply_not_regular(reply_t *r, const char *path) {
    char msg[4200];
    snprintf(msg, sizeof msg, "not a regular file: %s", path);
    put_str(r, "err");
    put_int(r, EINVAL);
    put_str(r, msg);
}

static void reply_err(reply_t *r, int err, const char *path) {
    char msg[4200];
    if (path) snprintf(msg, sizeof msg, "%s: %s", strerror(err), path);
    else snprintf(msg, sizeof msg, "%s", strerror(err));
    put_str(r, "err");
    put_int(r, err);
    put_str(r, msg);
}

/* ---- environment -------------------------------------------------------------------- */
typedef struct { char **v; size_t n, cap; } env_t;

static void env_reserve(env_t *e, size_t more) {
    if (e->n + more + 1 > e->cap) {
        while (e->n + more + 1 > e->cap) e->cap = e->cap ? e->cap * 2 : 32;
        e->v = realloc(e->v, e->cap * sizeof(char *));
        if (!e->v) die("realloc");
    }
    e->v[e->n] = NULL;
}

/* sets K=V (replacing an earlier K); items without '=' are skipped; v stays NULL-terminated */
static void env_set(env_t *e, const char *kv, size_t len) {
    env_reserve(e, 1);
    const char *eq = memchr(kv, '=', len);
    if (!eq) return;
    size_t klen = (size_t)(eq - kv) + 1;
    char *item = malloc(len + 1);
    if (!item) die("malloc");
    memcpy(item, kv, len);
    item[len] = 0;
    for (size_t i = 0; i < e->n; i++)
        if (!strncmp(e->v[i], item, klen)) {
            free(e->v[i]);
            e->v[i] = item;
            return;
        }
    e->v[e->n++] = item;
    e->v[e->n] = NULL;
    e->v[e->n] = NULL;
}

static void env_clear(env_t *e) {
    for (size_t i = 0; i < e->n; i++) free(e->v[i]);
    free(e->v);
    memset(e, 0, sizeof *e);
}

static void env_copy(env_t *dst, const env_t *src) {
    memset(dst, 0, sizeof *dst);
    env_reserve(dst, src->n);
    for (size_t i = 0; i < src->n; i++) env_set(dst, src->v[i], strlen(src->v[i]));
}

static env_t g_env;
static char *g_cwd;

/* ---- processes ---------------------------------------------------------------------- */
static void reap_orphans(void) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static int others_alive(void) {
    DIR *d = opendir("/proc");
    struct dirent *de;
    int alive = 0;
    pid_t me = getpid();
    if (!d) return 0;
    while ((de = readdir(d)))
        if (de->d_name[0] >= '0' && de->d_name[0] <= '9' && atoi(de->d_name) != me) alive = 1;
    closedir(d);
    return alive;
}

static void op_killall(reply_t *r) {
    for (int i = 0; i < 200; i++) {
        kill(-1, SIGKILL); /* pid 1 is exempt: everything but us */
        reap_orphans();
        if (!others_alive()) {
            put_str(r, "ok");
            return;
        }
        usleep(5000);
    }
    put_str(r, "err");
    put_int(r, EBUSY);
    put_str(r, "processes survived kill");
}

/* head + tail of a stream, like bwrap_server.Capture */
typedef struct { buf_t head, tail; size_t half, total; } capture_t;

static void cap_add(capture_t *c, const char *p, size_t n) {
    c->total += n;
    if (c->head.n < c->half) {
        size_t room = c->half - c->head.n, k = n < room ? n : room;
        buf_add(&c->head, p, k);
        p += k;
        n -= k;
    }
    if (!n) return;
    if (n >= c->half) {
        c->tail.n = 0;
        buf_add(&c->tail, p + n - c->half, c->half);
        return;
    }
    if (c->tail.n + n > c->half) {
        size_t drop = c->tail.n + n - c->half;
        memmove(c->tail.p, c->tail.p + drop, c->tail.n - drop);
        c->tail.n -= drop;
    }
    buf_add(&c->tail, p, n);
}

/* appends the kept bytes as one field; returns 1 when something was omitted */
static int cap_put(reply_t *r, capture_t *c) {
    size_t omitted = c->total - c->head.n - c->tail.n;
    buf_t out = {0};
    buf_add(&out, c->head.p ? c->head.p : "", c->head.n);
    if (omitted) {
        char mark[80];
        int m = snprintf(mark, sizeof mark, "\n[... %zu bytes of output omitted ...]\n", omitted);
        buf_add(&out, mark, (size_t)m);
    }
    buf_add(&out, c->tail.p ? c->tail.p : "", c->tail.n);
    put_field(r, out.p, out.n);
    free(out.p);
    free(c->head.p);
    free(c->tail.p);
    return omitted > 0;
}

static void load_state(void) {
    /* the agent may have swapped the file for a fifo or a link: never block or follow */
    int fd = open(STATE_FILE, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    struct stat st;
    if (fd < 0) return;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size > (16 << 20)) {
        close(fd);
        return;
    }
    buf_t b = {0};
    char chunk[65536];
    ssize_t n;
    while ((n = read(fd, chunk, sizeof chunk)) > 0) buf_add(&b, chunk, (size_t)n);
    close(fd);
    if (!b.p || !memchr(b.p, 0, b.n)) {
        free(b.p);
        return;
    }
    buf_add(&b, "", 1);
    env_t env = {0};
    char *p = b.p, *end = b.p + b.n - 1;
    char *pwd = p;
    p += strlen(p) + 1;
    while (p < end) {
        size_t len = strlen(p);
        if (strncmp(p, "_=", 2) && strncmp(p, "SHLVL=", 6) && strncmp(p, "OLDPWD=", 7)) env_set(&env, p, len);
        p += len + 1;
    }
    if (pwd[0] == '/') {
        free(g_cwd);
        g_cwd = strdup(pwd);
    }
    env_clear(&g_env);
    env_reserve(&env, 0);
    g_env = env;
    free(b.p);
}

static void child_signals_default(void) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
}

static void op_exec(reply_t *r, frame_t *q) {
    /* exec CMD TIMEOUT_MS CWD ENV MODE MAX_OUT */
    const char *cmd = q->f[1], *cwd = q->f[3], *mode = q->f[5];
    long timeout_ms = atol(q->f[2]), max_out = atol(q->f[6]);
    int persist = !strcmp(mode, "persist");
    if (strlen(cmd) != q->len[1] || strlen(cwd) != q->len[3]) { /* a failed command, not a failed sandbox */
        put_str(r, "ok");
        put_int(r, 127);
        put_int(r, 0);
        put_int(r, 0);
        put_str(r, "");
        put_str(r, "tinkrl: the command or its directory contains a NUL byte\n");
        put_str(r, "0.000000");
        return;
    }
    reap_orphans();
    env_t env = {0};
    if (strcmp(mode, "fresh")) env_copy(&env, &g_env);
    env_reserve(&env, 0);
    for (char *p = q->f[4], *end = q->f[4] + q->len[4]; p < end;) {
        size_t len = strnlen(p, (size_t)(end - p));
        env_set(&env, p, len);
        p += len + 1;
    }
    buf_t script = {0};
    if (persist) {
        buf_add(&script, SAVE_STATE, sizeof SAVE_STATE - 1);
        unlink(STATE_FILE);
    }
    buf_add(&script, cmd, q->len[1]);
    buf_add(&script, "", 1);
    const char *workdir = q->len[3] ? cwd : g_cwd;
    int outp[2], errp[2];
    if (pipe2(outp, O_CLOEXEC) || pipe2(errp, O_CLOEXEC)) {
        reply_err(r, errno, NULL);
        return;
    }
    double start = now_s();
    pid_t pid = fork();
    if (pid == 0) { /* child: own session so a timeout can kill the whole group */
        setsid();
        child_signals_default();
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        dup2(null, 0);
        dup2(outp[1], 1);
        dup2(errp[1], 2);
        if (chdir(workdir)) {
            dprintf(2, "cannot cd to %s: %s\n", workdir, strerror(errno));
            _exit(1);
        }
        char *argv[] = {"bash", "--noprofile", "--norc", "-c", script.p, NULL};
        execve(SHELL, argv, env.v);
        _exit(127);
    }
    close(outp[1]);
    close(errp[1]);
    free(script.p);
    env_clear(&env);
    if (pid < 0) {
        int e = errno;
        close(outp[0]);
        close(errp[0]);
        reply_err(r, e, NULL);
        return;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    size_t half = max_out / 2 > 0 ? (size_t)(max_out / 2) : 1;
    capture_t caps[2] = {{.half = half}, {.half = half}};
    int fds[2] = {outp[0], errp[0]};
    int open_streams = 2, status = 0, have_status = 0, timed_out = 0;
    double deadline = start + timeout_ms / 1000.0, drain_until = 0;
    char chunk[65536];
    while (open_streams || !have_status) {
        double t = now_s(), wait;
        if (!have_status) {
            wait = deadline - t;
            if (wait <= 0) {
                timed_out = 1;
                kill(-pid, SIGKILL);
                kill(pid, SIGKILL); /* in case it had not reached setsid() yet */
                waitpid(pid, &status, 0);
                have_status = 1;
                /* the group's orphans are ours to reap: gone before we answer (up to 2 s) */
                for (int i = 0; i < 2000 && kill(-pid, 0) == 0; i++) {
                    reap_orphans();
                    if (kill(-pid, 0)) break;
                    usleep(1000);
                }
                break;
            }
        } else {
            if (!drain_until) drain_until = t + DRAIN_AFTER_EXIT_MS / 1000.0;
            wait = drain_until - t;
            if (wait <= 0) break;
        }
        struct pollfd pf[3];
        int n = 0, idx[3];
        for (int i = 0; i < 2; i++)
            if (fds[i] >= 0) {
                pf[n].fd = fds[i];
                pf[n].events = POLLIN;
                idx[n++] = i;
            }
        if (!have_status && pidfd >= 0) {
            pf[n].fd = pidfd;
            pf[n].events = POLLIN;
            idx[n++] = 2;
        }
        int ms = wait > 60.0 ? 60000 : (int)(wait * 1000.0) + 1;
        if (!have_status && pidfd < 0 && ms > 10) ms = 10; /* no pidfd: poll waitpid */
        int k = poll(pf, (nfds_t)n, ms);
        if (k < 0 && errno != EINTR) break;
        if (!have_status && pidfd < 0 && waitpid(pid, &status, WNOHANG) == pid) have_status = 1;
        for (int j = 0; k > 0 && j < n; j++) {
            if (!pf[j].revents) continue;
            if (idx[j] == 2) {
                waitpid(pid, &status, 0);
                have_status = 1;
                continue;
            }
            ssize_t got = read(pf[j].fd, chunk, sizeof chunk);
            if (got > 0) cap_add(&caps[idx[j]], chunk, (size_t)got);
            else if (got == 0 || errno != EINTR) {
                close(fds[idx[j]]);
                fds[idx[j]] = -1;
                open_streams--;
            }
        }
    }
    if (!have_status) { /* poll failed: never leave the command running unaccounted for */
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        timed_out = 1;
    }
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) close(fds[i]);
    if (pidfd >= 0) close(pidfd);
    double duration = now_s() - start;
    long code;
    if (timed_out) code = -1;
    else if (WIFEXITED(status)) code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) code = 128 + WTERMSIG(status);
    else code = -1;
    if (persist && !timed_out && !q->len[3]) load_state();
    put_str(r, "ok");
    put_int(r, code);
    put_int(r, timed_out);
    reply_t rest = {0};
    int cut = cap_put(&rest, &caps[0]);
    cut |= cap_put(&rest, &caps[1]);
    put_int(r, cut);
    buf_add(&r->b, rest.b.p, rest.b.n);
    r->count += rest.count;
    free(rest.b.p);
    char dur[32];
    snprintf(dur, sizeof dur, "%.6f", duration);
    put_str(r, dur);
}

/* ---- files -------------------------------------------------------------------------- */
static int makedirs(char *path, char **failed) {
    for (char *p = path + 1;; p++) {
        if (*p == '/' || !*p) {
            char c = *p;
            *p = 0;
            int rc = mkdir(path, 0777);
            int e = errno;
            struct stat st;
            if (rc && !(e == EEXIST && !stat(path, &st) && S_ISDIR(st.st_mode))) {
                *failed = strdup(path);
                *p = c;
                errno = e == EEXIST ? EEXIST : e;
                return -1;
            }
            *p = c;
            if (!c) return 0;
        }
    }
}

static void op_write(reply_t *r, frame_t *q) {
    char *path = q->f[1];
    mode_t mode = (mode_t)strtol(q->f[2], NULL, 10);
    char *slash = strrchr(path, '/');
    if (slash && slash != path) {
        char *failed = NULL;
        *slash = 0;
        int rc = makedirs(path, &failed);
        *slash = '/';
        if (rc) {
            reply_err(r, errno, failed);
            free(failed);
            return;
        }
    }
    /* only regular files: a planted link to /proc/1/fd/1 must not reach the host's pipe */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, mode);
    struct stat st;
    if (fd < 0) {
        reply_err(r, errno, path);
        return;
    }
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        reply_not_regular(r, path);
        return;
    }
    int rc = write_all(fd, q->f[3], q->len[3]);
    int e = errno;
    if (!rc && fchmod(fd, mode)) rc = -1, e = errno;
    close(fd);
    if (rc) reply_err(r, e, path);
    else put_str(r, "ok");
}

static void op_read(reply_t *r, frame_t *q) {
    int fd = open(q->f[1], O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    if (fd < 0) {
        reply_err(r, errno, q->f[1]);
        return;
    }
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) { /* never our own pipes, fifos or devices */
        close(fd);
        if (S_ISDIR(st.st_mode)) reply_err(r, EISDIR, q->f[1]);
        else reply_not_regular(r, q->f[1]);
        return;
    }
    buf_t b = {0};
    char chunk[65536];
    ssize_t n;
    while ((n = read(fd, chunk, sizeof chunk)) > 0) buf_add(&b, chunk, (size_t)n);
    int e = errno;
    close(fd);
    if (n < 0) reply_err(r, e, q->f[1]);
    else {
        put_str(r, "ok");
        put_field(r, b.p ? b.p : "", b.n);
    }
    free(b.p);
}

/* 1 when b holds exactly one whole frame (a killed helper may leave half a reply) */
static int frame_complete(const buf_t *b) {
    if (b->n < 4) return 0;
    const unsigned char *p = (const unsigned char *)b->p;
    size_t off = 4;
    for (uint32_t i = 0, count = be32(p); i < count; i++) {
        if (b->n - off < 4) return 0;
        size_t n = be32(p + off);
        off += 4;
        if (b->n - off < n) return 0;
        off += n;
    }
    return off == b->n;
}

/* tar/untar: one-shot python helper; the request goes in on a pipe, the reply comes back */
static void op_helper(reply_t *r, frame_t *q) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)) {
        reply_err(r, errno, NULL);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        child_signals_default();
        int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(null, 2); /* never the host's stderr pipe: errors come back in the reply */
        char *argv[] = {"python3", "-I", "-S", HELPER_SERVER, "--one", NULL};
        char *envp[] = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8", NULL};
        execve(HELPER_PYTHON, argv, envp);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    if (pid < 0) {
        close(in[1]);
        close(out[0]);
        reply_err(r, errno, NULL);
        return;
    }
    reply_t req = {0}; /* the same request, re-framed; the helper reads all of it before replying */
    for (uint32_t i = 0; i < q->count; i++) put_field(&req, q->f[i], q->len[i]);
    unsigned char h[4] = {(unsigned char)(req.count >> 24), (unsigned char)(req.count >> 16),
                          (unsigned char)(req.count >> 8), (unsigned char)req.count};
    if (!write_all(in[1], (char *)h, 4)) write_all(in[1], req.b.p, req.b.n);
    free(req.b.p);
    close(in[1]);
    buf_t b = {0};
    char chunk[65536];
    ssize_t n;
    while ((n = read(out[0], chunk, sizeof chunk)) != 0) {
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        buf_add(&b, chunk, (size_t)n);
    }
    close(out[0]);
    waitpid(pid, NULL, 0);
    if (!frame_complete(&b)) {
        put_str(r, "err");
        put_int(r, EIO);
        put_str(r, "the file helper died without a reply");
        free(b.p);
        return;
    }
    /* forward the helper's frame as is */
    if (write_all(1, b.p, b.n)) _exit(0);
    free(b.p);
    r->count = UINT32_MAX; /* already sent */
}

/* ---- modes -------------------------------------------------------------------------- */
static int launch(int argc, char **argv) {
    /* --launch UID CGROUP_PROCS... -- ARGV... */
    if (argc < 5) {
        fprintf(stderr, "usage: tinkrl-init --launch UID CGROUP_PROCS... -- ARGV...\n");
        return 2;
    }
    uid_t uid = (uid_t)strtoul(argv[2], NULL, 10);
    int i = 3;
    char pid[32];
    snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    for (; i < argc && strcmp(argv[i], "--"); i++) {
        int fd = open(argv[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write_all(fd, pid, strlen(pid))) {
            fprintf(stderr, "tinkrl-init: cannot join cgroup %s: %s\n", argv[i], strerror(errno));
            return 126;
        }
        close(fd);
    }
    if (i + 1 >= argc) return 2;
    if (setgroups(0, NULL) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) die("tinkrl-init: drop to uid");
    uid_t ru, eu, su;
    if (getresuid(&ru, &eu, &su) || ru != uid || eu != uid || su != uid || uid == 0) {
        fprintf(stderr, "tinkrl-init: still privileged after setresuid\n");
        return 126;
    }
    execv(argv[i + 1], argv + i + 1);
    die("tinkrl-init: exec");
    return 127;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--launch")) return launch(argc, argv);
    if (argc < 4) {
        fprintf(stderr, "usage: tinkrl-init WORKDIR NPROC MEM_BYTES K=V...\n");
        return 2;
    }
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* the agent (same uid) cannot ptrace us or read /proc/1/{mem,fd} */
    signal(SIGPIPE, SIG_IGN);           /* a vanished host shows up as EPIPE, handled by exiting */
    struct rlimit lim = {0, 0};
    setrlimit(RLIMIT_CORE, &lim);
    long nproc = atol(argv[2]), mem = atol(argv[3]);
    if (nproc > 0) {
        lim.rlim_cur = lim.rlim_max = (rlim_t)nproc;
        setrlimit(RLIMIT_NPROC, &lim);
    }
    if (mem > 0) {
        lim.rlim_cur = lim.rlim_max = (rlim_t)mem;
        setrlimit(RLIMIT_AS, &lim);
    }
    g_cwd = strdup(argv[1]);
    for (int i = 4; i < argc; i++) env_set(&g_env, argv[i], strlen(argv[i]));
    env_reserve(&g_env, 0);
    mkdir("/run/tinkrl", 0777);
    mkdir("/logs", 0777);
    mkdir("/logs/verifier", 0777);
    reply_t r = {0};
    put_str(&r, "ready");
    send_reply(&r);
    for (;;) {
        frame_t q;
        if (recv_frame(0, &q)) return 0; /* host closed the pipe: the sandbox ends with us */
        const char *op = q.count ? q.f[0] : "";
        if (!strcmp(op, "exec") && q.count >= 7) op_exec(&r, &q);
        else if (!strcmp(op, "write") && q.count >= 4) op_write(&r, &q);
        else if (!strcmp(op, "read") && q.count >= 2) op_read(&r, &q);
        else if ((!strcmp(op, "tar") || !strcmp(op, "untar")) && q.count >= 2) op_helper(&r, &q);
        else if (!strcmp(op, "killall")) op_killall(&r);
        else if (!strcmp(op, "ping")) put_str(&r, "ok");
        else {
            put_str(&r, "err");
            put_int(&r, EINVAL);
            put_str(&r, "unknown or malformed request");
        }
        frame_free(&q);
        if (r.count == UINT32_MAX) memset(&r, 0, sizeof r);
        else send_reply(&r);
    }
}
