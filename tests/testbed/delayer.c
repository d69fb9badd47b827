/* Ingress delay (and optional random loss) for one simulated host: an NFQUEUE verdict loop.
 *
 * The lab kernel has no netem (and no fq for timestamp-paced delay), so latency is added in
 * user space: iptables sends the host's incoming packets to NFQUEUE and this program gives each
 * one its verdict (accept) a fixed time after it arrived. tests/testbed/latency.py compiles it
 * (gcc, libnetfilter-queue) into the test bed's state dir and starts one per host, inside the
 * host's namespace:
 *
 *     delayer --queue 1:20 --queue 2:40 [--loss 0.01] [--seed 7] [--max-seconds 3600]
 *
 * - `--queue NUM:MS` binds NFQUEUE NUM; every packet in it is released MS ms after it was
 *   read. A queue has one constant delay, so release order is arrival order (FIFO): TCP sees
 *   latency, never reordering.
 * - `--loss P` drops each packet (all queues) with probability P, on arrival.
 * - One thread: ppoll() on the netlink socket with a timeout up to the next due packet, then
 *   read everything waiting and release everything due.
 * - Why C: the same loop in Python (netfilterqueue) spent ~20 us of user CPU a packet, as much
 *   as the kernel's own work for it; a two-site P9 run's delayers used 18 s of CPU on the 2
 *   cores the simulated hosts share (a real link costs its hosts none). Here user time is ~2 us.
 * - Released with one batch verdict per queue (every id up to the last due one): ids grow in
 *   a queue, so that is exactly the due packets, plus any whose notification the socket
 *   dropped (ENOBUFS), which would otherwise wait in the kernel for ever.
 * - Payloads are not copied to user space (COPY_META): a verdict needs only the id.
 * - Bounded: exits after --max-seconds. On exit (that, SIGTERM or SIGINT) every packet is
 *   accepted first, so stopping the delayer loses nothing (let_go); later packets pass
 *   undelayed (the rules use --queue-bypass) until the rules go.
 * - Its priority (nice) is set by whoever starts it (latency.py: ahead of the workload).
 * - Prints "ready" once every queue is bound, and "accepted N dropped N cpu Xs" at exit.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_QUEUES 8
/* Packets held in the kernel awaiting our verdict count against the queue's length: at
 * 50 Mbit/s and 75 ms that is ~300 packets; far more at LAN rates. */
#define KERNEL_QUEUE_LEN 65536
#define SOCKET_BUFFER (8 << 20)
#define MAX_DELAY_MS 10000.0

struct held { double due; uint32_t id; };

/* One queue's FIFO of held packets: a ring that doubles when full. */
struct line {
    unsigned number;
    uint32_t last_id;  /* the newest packet read from the kernel */
    double delay_s;
    struct nfq_q_handle *queue;
    struct held *items;
    size_t cap, head, len;
};

static struct line lines[MAX_QUEUES];
static int nlines;
static double loss;
static unsigned long accepted, dropped;
static volatile sig_atomic_t stopping;

static void on_signal(int signum) { (void)signum; stopping = 1; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void push(struct line *l, uint32_t id, double due) {
    if (l->len == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4096;
        struct held *items = malloc(cap * sizeof *items);
        if (!items) { perror("delayer: malloc"); exit(1); }
        for (size_t i = 0; i < l->len; i++) items[i] = l->items[(l->head + i) % l->cap];
        free(l->items);
        l->items = items, l->cap = cap, l->head = 0;
    }
    l->items[(l->head + l->len) % l->cap] = (struct held){due, id};
    l->len++;
}

/* Accept every packet of the line due by `t`. */
static void release(struct line *l, double t) {
    uint32_t last = 0;
    size_t n = 0;
    while (l->len && l->items[l->head].due <= t) {
        last = l->items[l->head].id;
        l->head = (l->head + 1) % l->cap, l->len--, n++;
    }
    if (n) {
        nfq_set_verdict_batch(l->queue, last, NF_ACCEPT);
        accepted += n;
    }
}

static int on_packet(struct nfq_q_handle *queue, struct nfgenmsg *msg, struct nfq_data *nfa,
                     void *data) {
    (void)msg;
    struct line *l = data;
    uint32_t id = ntohl(nfq_get_msg_packet_hdr(nfa)->packet_id);
    l->last_id = id;
    if (loss > 0 && drand48() < loss) {
        dropped++;
        return nfq_set_verdict(queue, id, NF_DROP, 0, NULL);
    }
    push(l, id, now_s() + l->delay_s);
    return 0;
}

static double next_wake(double deadline) {
    double wake = deadline;
    for (int i = 0; i < nlines; i++)
        if (lines[i].len && lines[i].items[lines[i].head].due < wake)
            wake = lines[i].items[lines[i].head].due;
    return wake;
}

static void serve(struct nfq_handle *h, double max_seconds) {
    int fd = nfq_fd(h);
    int rcvbuf = SOCKET_BUFFER;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
    static char buf[65536] __attribute__((aligned));
    double deadline = now_s() + max_seconds;
    for (double t; !stopping && (t = now_s()) < deadline;) {
        double wait = next_wake(deadline) - t;
        struct timespec timeout = {0, 0};
        if (wait > 0) {
            timeout.tv_sec = (time_t)wait;
            timeout.tv_nsec = (long)((wait - (double)timeout.tv_sec) * 1e9);
        }
        struct pollfd p = {fd, POLLIN, 0};
        if (ppoll(&p, 1, &timeout, NULL) > 0) {
            ssize_t r;
            while ((r = recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0 || (r < 0 && errno == ENOBUFS))
                if (r > 0) nfq_handle_packet(h, buf, (int)r);
        }
        t = now_s();
        for (int i = 0; i < nlines; i++) release(&lines[i], t);
    }
}

/* Unbinding a queue drops every packet still in it, and the kernel may hold some we never
 * read: they came while we were not scheduled, or after the signal cut ppoll() short. So the
 * queues first fail open with room for none (every new packet is accepted on arrival, the
 * kernel's own path when a queue is full), and then one batch verdict per queue accepts
 * everything queued, read or not: ids grow, and the kernel accepts every id up to the one
 * named (wrapping compare), which lies 2^30 past the newest read. */
static void let_go(void) {
    for (int i = 0; i < nlines; i++) {
        nfq_set_queue_flags(lines[i].queue, NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_FAIL_OPEN);
        nfq_set_queue_maxlen(lines[i].queue, 0);
    }
    for (int i = 0; i < nlines; i++) {
        struct line *l = &lines[i];
        accepted += l->len;
        l->len = 0;
        nfq_set_verdict_batch(l->queue, l->last_id + (1u << 30), NF_ACCEPT);
    }
}

static int usage(const char *why, const char *arg) {
    fprintf(stderr, "delayer: %s%s%s\nusage: delayer --queue NUM:MS [--queue NUM:MS ...] "
            "[--loss P] [--seed N] [--max-seconds S]\n", why, arg ? ": " : "", arg ? arg : "");
    return 2;
}

static int parse_queue(const char *text, struct line *l) {
    unsigned number;
    double ms;
    int end = 0;
    if (sscanf(text, "%u:%lf%n", &number, &ms, &end) != 2 || text[end] != '\0' || text[0] == '-'
        || number > 65535)
        return usage("expected --queue NUM:MS", text);
    if (!(ms >= 0 && ms <= MAX_DELAY_MS))
        return usage("delay must be 0..10000 ms", text);
    *l = (struct line){.number = number, .delay_s = ms / 1000};
    return 0;
}

static int parse_number(const char *text, double low, double high, double *out, const char *what) {
    char *end;
    double value = strtod(text, &end);
    if (end == text || *end != '\0' || !(value >= low && value < high)) return usage(what, text);
    *out = value;
    return 0;
}

int main(int argc, char **argv) {
    double max_seconds = 3600, seed = 0;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 == argc) return usage("missing value after", argv[i]);
        const char *value = argv[i + 1];
        int bad = 0;
        if (!strcmp(argv[i], "--queue")) {
            if (nlines == MAX_QUEUES) return usage("too many queues", value);
            bad = parse_queue(value, &lines[nlines++]);
        } else if (!strcmp(argv[i], "--loss")) {
            bad = parse_number(value, 0, 1, &loss, "--loss must be in [0, 1)");
        } else if (!strcmp(argv[i], "--seed")) {
            bad = parse_number(value, 0, 4294967296.0, &seed, "--seed must be 0..2^32-1");
        } else if (!strcmp(argv[i], "--max-seconds")) {
            bad = parse_number(value, 0, 1e9, &max_seconds, "--max-seconds must be >= 0");
        } else {
            return usage("unknown option", argv[i]);
        }
        if (bad) return bad;
    }
    if (!nlines) return usage("at least one --queue is needed", NULL);
    srand48((long)seed);
    struct sigaction stop = {.sa_handler = on_signal};
    sigaction(SIGTERM, &stop, NULL);
    sigaction(SIGINT, &stop, NULL);

    struct nfq_handle *h = nfq_open();
    if (!h) { perror("delayer: nfq_open"); return 1; }
    for (int i = 0; i < nlines; i++) {
        lines[i].queue = nfq_create_queue(h, (uint16_t)lines[i].number, on_packet, &lines[i]);
        if (!lines[i].queue) { fprintf(stderr, "delayer: cannot bind queue %u\n", lines[i].number); return 1; }
        if (nfq_set_mode(lines[i].queue, NFQNL_COPY_META, 0) < 0
            || nfq_set_queue_maxlen(lines[i].queue, KERNEL_QUEUE_LEN) < 0) {
            fprintf(stderr, "delayer: cannot configure queue %u\n", lines[i].number);
            return 1;
        }
    }
    printf("ready\n");
    fflush(stdout);
    serve(h, max_seconds);
    let_go();
    for (int i = 0; i < nlines; i++) nfq_destroy_queue(lines[i].queue);
    nfq_close(h);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("accepted %lu dropped %lu cpu %.2fs\n", accepted, dropped,
           (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec)
               + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
    return 0;
}
