/* test_trackers.c — the trackers (ember/tracker.h) and the Accelerator's
 * log_with / init_trackers / log / end_training. The TensorBoard files are
 * read back by a reader written here from the format (TFRecord framing,
 * protobuf wire format), independent of the writer: every record's length
 * and both masked CRC-32Cs are checked and every Event decoded. (That
 * TensorBoard itself reads them is scripts/check_tensorboard.sh.) */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dist/tracker_impl.h"
#include "dist_util.h"
#include "harness.h"

static void no_user_config(void)
{
    th_no_user_config();
    unsetenv("EMBER_LOG_WITH");
}

static char *tmpdir(void)
{
    static char dir[PATH_MAX];
    return th_tmpdir(dir, sizeof dir, "ember-track");
}

/* the whole text file (malloc'd) */
static char *text_of(const char *path)
{
    size_t n;
    return th_slurp(path, &n);
}

/* ---- a TFRecord / Event reader, from the format ------------------------------- */

enum { MAXV = 8 };
typedef struct tb_event {
    double wall_time;
    int64_t step;
    char file_version[64];
    int session_status; /* SessionLog.status, 0 when the Event has none */
    int nvalues;
    char tag[MAXV][64];
    float value[MAXV];
} tb_event;

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t unmask(uint32_t m)
{
    uint32_t r = m - 0xa282ead8u;
    return (r >> 17) | (r << 15);
}

static bool varint(const unsigned char **p, const unsigned char *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; *p < end && shift < 64; shift += 7) {
        unsigned char c = *(*p)++;
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return true;
    }
    return false;
}

/* One field: its number, wire type, and either its integer/fixed value or
 * its bytes [*data, *data + *len). */
static bool field(const unsigned char **p, const unsigned char *end, int *num, int *wire, uint64_t *v,
                  const unsigned char **data, size_t *len)
{
    uint64_t key;
    if (!varint(p, end, &key)) return false;
    *num = (int)(key >> 3);
    *wire = (int)(key & 7);
    switch (*wire) {
    case 0: return varint(p, end, v);
    case 1:
        if (end - *p < 8) return false;
        *v = le(*p, 8);
        *p += 8;
        return true;
    case 5:
        if (end - *p < 4) return false;
        *v = le(*p, 4);
        *p += 4;
        return true;
    case 2:
        if (!varint(p, end, v) || *v > (uint64_t)(end - *p)) return false;
        *data = *p;
        *len = (size_t)*v;
        *p += *len;
        return true;
    default: return false;
    }
}

static bool decode_value(const unsigned char *p, const unsigned char *end, tb_event *e)
{
    if (e->nvalues == MAXV) return false;
    int k = e->nvalues++, num, wire;
    uint64_t v = 0;
    const unsigned char *d = NULL;
    size_t n = 0;
    while (p < end) {
        if (!field(&p, end, &num, &wire, &v, &d, &n)) return false;
        if (num == 1 && wire == 2 && n < sizeof e->tag[k]) {
            memcpy(e->tag[k], d, n);
            e->tag[k][n] = 0;
        } else if (num == 2 && wire == 5) {
            uint32_t bits = (uint32_t)v;
            memcpy(&e->value[k], &bits, 4);
        } else {
            return false; /* the writer writes nothing else */
        }
    }
    return true;
}

static bool decode_event(const unsigned char *p, const unsigned char *end, tb_event *e)
{
    memset(e, 0, sizeof *e);
    int num, wire;
    uint64_t v = 0;
    const unsigned char *d = NULL;
    size_t n = 0;
    while (p < end) {
        if (!field(&p, end, &num, &wire, &v, &d, &n)) return false;
        if (num == 1 && wire == 1)
            memcpy(&e->wall_time, &v, 8);
        else if (num == 2 && wire == 0)
            e->step = (int64_t)v;
        else if (num == 3 && wire == 2 && n < sizeof e->file_version) {
            memcpy(e->file_version, d, n);
            e->file_version[n] = 0;
        } else if (num == 7 && wire == 2) {
            const unsigned char *q = d;
            int sn, sw;
            uint64_t sv = 0;
            const unsigned char *sd = NULL;
            size_t sl = 0;
            if (!field(&q, d + n, &sn, &sw, &sv, &sd, &sl) || sn != 1 || sw != 0 || q != d + n) return false;
            e->session_status = (int)sv;
        } else if (num == 5 && wire == 2) {
            const unsigned char *q = d, *qend = d + n;
            while (q < qend) { /* Summary: repeated Value value = 1 */
                int vn, vw;
                uint64_t vv = 0;
                const unsigned char *vd = NULL;
                size_t vl = 0;
                if (!field(&q, qend, &vn, &vw, &vv, &vd, &vl) || vn != 1 || vw != 2) return false;
                if (!decode_value(vd, vd + vl, e)) return false;
            }
        } else {
            return false;
        }
    }
    return true;
}

/* Every record of the file at path into ev[0..max): the count, or -1 with
 * the first problem in why (a short record, a length or data CRC that does
 * not match, an Event that does not decode). */
static int read_events(const char *path, tb_event *ev, int max, char *why, size_t whyn)
{
    size_t n;
    unsigned char *f = (unsigned char *)th_slurp(path, &n);
    int count = 0;
    size_t at = 0;
    snprintf(why, whyn, "ok");
    while (at < n) {
        if (n - at < 12) {
            snprintf(why, whyn, "record %d: %zu bytes left, a header needs 12", count, n - at);
            count = -1;
            break;
        }
        uint64_t len = le(f + at, 8);
        uint32_t lcrc = (uint32_t)le(f + at + 8, 4);
        if (unmask(lcrc) != tracker_crc32c(0, f + at, 8)) {
            snprintf(why, whyn, "record %d: length crc mismatch", count);
            count = -1;
            break;
        }
        if (len > n - at - 12 || n - at - 12 - len < 4) {
            snprintf(why, whyn, "record %d: length %llu runs past the file", count, (unsigned long long)len);
            count = -1;
            break;
        }
        const unsigned char *data = f + at + 12;
        uint32_t dcrc = (uint32_t)le(data + len, 4);
        if (unmask(dcrc) != tracker_crc32c(0, data, len)) {
            snprintf(why, whyn, "record %d: data crc mismatch", count);
            count = -1;
            break;
        }
        if (count >= max || !decode_event(data, data + len, &ev[count])) {
            snprintf(why, whyn, "record %d: does not decode as an Event", count);
            count = -1;
            break;
        }
        count++;
        at += 12 + len + 4;
    }
    free(f);
    return count;
}

/* the one events.out.tfevents.* file in dir (fails the test otherwise) */
static const char *event_file(const char *dir)
{
    static char path[PATH_MAX];
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    int found = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, "events.out.tfevents.", 20)) {
            th_pathf(path, sizeof path, "%s/%s", dir, e->d_name);
            found++;
        }
    closedir(d);
    if (found != 1) th_fail(__FILE__, __LINE__, "%d event files in %s, want 1", found, dir);
    return path;
}

static int count_event_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    for (struct dirent *e; (e = readdir(d));) found += !strncmp(e->d_name, "events.out.tfevents.", 20);
    closedir(d);
    return found;
}

/* ---- the checksum --------------------------------------------------------------- */

TEST(test_crc32c_gives_the_castagnoli_check_value)
{
    CHECK(tracker_crc32c(0, "123456789", 9) == 0xE3069283u);
    CHECK(tracker_crc32c(0, "", 0) == 0);
    /* continued over two pieces = over the whole */
    CHECK(tracker_crc32c(tracker_crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u);
}

TEST(test_crc_mask_rotates_and_adds_the_tfrecord_delta)
{
    CHECK(tracker_crc_mask(0) == 0xa282ead8u);
    CHECK(tracker_crc_mask(1u << 15) == 0xa282ead8u + 1);
    CHECK(unmask(tracker_crc_mask(0xE3069283u)) == 0xE3069283u);
}

/* ---- TensorBoard ------------------------------------------------------------------ */

TEST(test_tracker_tensorboard_round_trip_checks_framing_crcs_and_events)
{
    char *dir = tmpdir();
    em_tracker *t =
        em_tracker_open("run", &(em_tracker_config){.log_with = EM_TRACK_TENSORBOARD, .logging_dir = dir});
    CHECK_NOTNULL(t);
    for (int64_t step = 0; step < 3; step++)
        CHECK_OK(em_tracker_log(
            t, step * 10, 2,
            (em_metric[]){{"train/loss", 4.0 - (double)step}, {"lr", 1e-3 * (double)(step + 1)}}));
    CHECK_OK(em_tracker_log(t, 1LL << 40, 1, (em_metric[]){{"val_loss", 0.1}}));
    const char *path = em_tracker_path(t, EM_TRACK_TENSORBOARD);
    CHECK(path && strstr(path, "/run/events.out.tfevents.") != NULL);
    CHECK(em_tracker_path(t, EM_TRACK_JSONL) == NULL);
    CHECK(!strcmp(path, event_file(th_path(dir, "run"))));
    char copy[PATH_MAX], why[256];
    snprintf(copy, sizeof copy, "%s", path);
    CHECK_OK(em_tracker_close(t));
    tb_event ev[8];
    int n = read_events(copy, ev, 8, why, sizeof why);
    if (n != 5) th_fail(__FILE__, __LINE__, "%d events (%s), want 5", n, why);
    CHECK(!strcmp(ev[0].file_version, "brain.Event:2"));
    CHECK(ev[0].nvalues == 0);
    double now = (double)time(NULL);
    for (int i = 0; i < 5; i++) CHECK(fabs(ev[i].wall_time - now) < 60);
    for (int i = 1; i <= 3; i++) {
        CHECK(ev[i].step == (i - 1) * 10);
        CHECK(ev[i].nvalues == 2);
        CHECK(!strcmp(ev[i].tag[0], "train/loss") && !strcmp(ev[i].tag[1], "lr"));
        CHECK(ev[i].value[0] == (float)(5 - i));
        CHECK(ev[i].value[1] == (float)(1e-3 * i));
    }
    CHECK(ev[4].step == 1LL << 40); /* a multi-byte varint */
    CHECK(ev[4].nvalues == 1 && !strcmp(ev[4].tag[0], "val_loss") && ev[4].value[0] == 0.1f);
}

/* The reader above is what vouches for the files: a flipped byte in a
 * record's length or in its data is caught by the matching CRC. */
TEST(test_tracker_reader_detects_a_corrupted_byte)
{
    char *dir = tmpdir();
    em_tracker *t =
        em_tracker_open("r", &(em_tracker_config){.log_with = EM_TRACK_TENSORBOARD, .logging_dir = dir});
    CHECK_NOTNULL(t);
    CHECK_OK(em_tracker_log(t, 1, 1, (em_metric[]){{"loss", 2.0}}));
    char path[PATH_MAX], why[256];
    snprintf(path, sizeof path, "%s", em_tracker_path(t, EM_TRACK_TENSORBOARD));
    CHECK_OK(em_tracker_close(t));
    size_t n;
    char *orig = th_slurp(path, &n);
    tb_event ev[4];
    CHECK(read_events(path, ev, 4, why, sizeof why) == 2);
    size_t first = 12 + (size_t)le((unsigned char *)orig, 8) + 4; /* the second record starts here */
    char *bad = malloc(n);
    memcpy(bad, orig, n);
    bad[n - 6] ^= 0x01; /* a byte of the last record's data */
    th_write_file(path, bad, n);
    CHECK(read_events(path, ev, 4, why, sizeof why) == -1);
    CHECK(strstr(why, "record 1: data crc mismatch") != NULL);
    memcpy(bad, orig, n);
    bad[first] ^= 0x01; /* the second record's length */
    th_write_file(path, bad, n);
    CHECK(read_events(path, ev, 4, why, sizeof why) == -1);
    CHECK(strstr(why, "record 1: length crc mismatch") != NULL);
    th_write_file(path, orig, n - 1); /* cut short */
    CHECK(read_events(path, ev, 4, why, sizeof why) == -1);
    free(bad);
    free(orig);
}

TEST(test_tracker_event_files_of_one_run_get_distinct_names)
{
    char *dir = tmpdir();
    em_tracker_config c = {.log_with = EM_TRACK_TENSORBOARD, .logging_dir = dir};
    em_tracker *a = em_tracker_open("same", &c), *b = em_tracker_open("same", &c);
    CHECK_NOTNULL(a);
    CHECK_NOTNULL(b);
    CHECK(strcmp(em_tracker_path(a, EM_TRACK_TENSORBOARD), em_tracker_path(b, EM_TRACK_TENSORBOARD)) != 0);
    CHECK_OK(em_tracker_close(a));
    CHECK_OK(em_tracker_close(b));
    CHECK(count_event_files(th_path(dir, "same")) == 2);
}

/* A resumed run's event file starts its records with SessionLog START at
 * the first logged step (TensorBoard then drops the earlier files' records
 * from that step on); only once. */
TEST(test_tracker_tensorboard_append_marks_a_restart_at_the_first_step)
{
    char *dir = tmpdir();
    em_tracker *t = em_tracker_open(
        "r", &(em_tracker_config){.log_with = EM_TRACK_TENSORBOARD, .logging_dir = dir, .append = true});
    CHECK_NOTNULL(t);
    CHECK_OK(em_tracker_log(t, 11, 1, (em_metric[]){{"loss", 1}}));
    CHECK_OK(em_tracker_log(t, 12, 1, (em_metric[]){{"loss", 2}}));
    char path[PATH_MAX], why[256];
    snprintf(path, sizeof path, "%s", em_tracker_path(t, EM_TRACK_TENSORBOARD));
    CHECK_OK(em_tracker_close(t));
    tb_event ev[8];
    int n = read_events(path, ev, 8, why, sizeof why);
    if (n != 4) th_fail(__FILE__, __LINE__, "%d events (%s), want 4", n, why);
    CHECK(ev[0].session_status == 0 && !strcmp(ev[0].file_version, "brain.Event:2"));
    CHECK(ev[1].session_status == 1 && ev[1].step == 11 && ev[1].nvalues == 0); /* START */
    CHECK(ev[2].session_status == 0 && ev[2].step == 11 && ev[2].value[0] == 1.0f);
    CHECK(ev[3].session_status == 0 && ev[3].step == 12 && ev[3].value[0] == 2.0f);
}

/* ---- JSONL ----------------------------------------------------------------------- */

TEST(test_tracker_jsonl_writes_one_object_per_call)
{
    char *dir = tmpdir();
    em_tracker *t =
        em_tracker_open("j", &(em_tracker_config){.log_with = EM_TRACK_JSONL, .logging_dir = dir});
    CHECK_NOTNULL(t);
    CHECK_OK(em_tracker_log(t, 0, 2, (em_metric[]){{"loss", 2.5}, {"lr", 1e-3}}));
    CHECK_OK(em_tracker_log(t, 7, 3, (em_metric[]){{"x", 0.1 + 0.2}, {"big", -3e300}, {"n", 42}}));
    CHECK_OK(em_tracker_log(t, 8, 0, NULL)); /* nothing */
    CHECK(!strcmp(em_tracker_path(t, EM_TRACK_JSONL), th_path(dir, "j/metrics.jsonl")));
    CHECK(em_tracker_path(t, EM_TRACK_TENSORBOARD) == NULL);
    CHECK_OK(em_tracker_close(t));
    char *got = text_of(th_path(dir, "j/metrics.jsonl"));
    const char *want = "{\"step\": 0, \"loss\": 2.5, \"lr\": 0.001}\n"
                       "{\"step\": 7, \"x\": 0.30000000000000004, \"big\": -3e+300, \"n\": 42}\n";
    if (strcmp(got, want)) th_fail(__FILE__, __LINE__, "metrics.jsonl is\n%swant\n%s", got, want);
    free(got);
    CHECK(count_event_files(th_path(dir, "j")) == 0);
}

TEST(test_tracker_jsonl_escapes_tags_and_writes_non_finite_values_as_null)
{
    char *dir = tmpdir();
    em_tracker *t =
        em_tracker_open("j", &(em_tracker_config){.log_with = EM_TRACK_JSONL, .logging_dir = dir});
    CHECK_NOTNULL(t);
    CHECK_OK(em_tracker_log(t, 1, 3, (em_metric[]){{"a\"b\\c", NAN}, {"tab\there", INFINITY}, {"ok", -0.5}}));
    CHECK_OK(em_tracker_close(t));
    char *got = text_of(th_path(dir, "j/metrics.jsonl"));
    const char *want = "{\"step\": 1, \"a\\\"b\\\\c\": null, \"tab\\u0009here\": null, \"ok\": -0.5}\n";
    if (strcmp(got, want)) th_fail(__FILE__, __LINE__, "metrics.jsonl is\n%swant\n%s", got, want);
    free(got);
}

TEST(test_tracker_jsonl_append_keeps_records_and_drops_a_torn_line)
{
    char *dir = tmpdir();
    const char *path = th_path(dir, "m.jsonl");
    const char *before = "{\"step\": 1, \"loss\": 3}\n{\"step\": 2, \"lo";
    th_write_file(path, before, strlen(before));
    em_tracker *t = em_tracker_open(
        "r", &(em_tracker_config){
                 .log_with = EM_TRACK_JSONL, .logging_dir = dir, .jsonl_path = path, .append = true});
    CHECK_NOTNULL(t);
    CHECK_OK(em_tracker_log(t, 2, 1, (em_metric[]){{"loss", 2}}));
    CHECK_OK(em_tracker_close(t));
    char *got = text_of(path);
    CHECK(!strcmp(got, "{\"step\": 1, \"loss\": 3}\n{\"step\": 2, \"loss\": 2}\n"));
    free(got);
    /* without append the file starts over */
    t = em_tracker_open("r", &(em_tracker_config){.log_with = EM_TRACK_JSONL, .jsonl_path = path});
    CHECK_NOTNULL(t);
    CHECK_OK(em_tracker_close(t));
    got = text_of(path);
    CHECK(!strcmp(got, ""));
    free(got);
}

TEST(test_tracker_writes_both_kinds_from_one_call)
{
    char *dir = tmpdir();
    em_tracker *t =
        em_tracker_open("both", &(em_tracker_config){.log_with = EM_TRACK_ALL, .logging_dir = dir});
    CHECK_NOTNULL(t);
    CHECK_OK(em_tracker_log(t, 3, 1, (em_metric[]){{"loss", 1.5}}));
    /* on disk before close: a crash now loses nothing */
    char *got = text_of(th_path(dir, "both/metrics.jsonl"));
    CHECK(!strcmp(got, "{\"step\": 3, \"loss\": 1.5}\n"));
    free(got);
    tb_event ev[4];
    char why[256];
    CHECK(read_events(event_file(th_path(dir, "both")), ev, 4, why, sizeof why) == 2);
    CHECK(ev[1].step == 3 && ev[1].value[0] == 1.5f);
    CHECK_OK(em_tracker_flush(t));
    CHECK_OK(em_tracker_close(t));
}

/* ---- bad input --------------------------------------------------------------------- */

TEST(test_tracker_open_rejects_bad_run_names_and_flags)
{
    char *dir = tmpdir();
    em_tracker_config c = {.log_with = EM_TRACK_JSONL, .logging_dir = dir};
    CHECK_ERR(em_tracker_open("a/b", &c), EM_ERR_ARG, "run name 'a/b'");
    CHECK_ERR(em_tracker_open("..", &c), EM_ERR_ARG, "run name '..'");
    CHECK_ERR(em_tracker_open("", &c), EM_ERR_ARG, "run name ''");
    CHECK_ERR(em_tracker_open(NULL, &c), EM_ERR_ARG, "run name is NULL");
    CHECK_ERR(em_tracker_open("r", NULL), EM_ERR_ARG, "cfg is NULL");
    CHECK_ERR(em_tracker_open("r", &(em_tracker_config){.logging_dir = dir}), EM_ERR_ARG, "log_with is 0");
    CHECK_ERR(em_tracker_open("r", &(em_tracker_config){.log_with = 8, .logging_dir = dir}), EM_ERR_ARG,
              "log_with 0x8 has unknown flags");
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));) entries++;
    closedir(d);
    CHECK(entries == 2); /* nothing was created */
}

TEST(test_tracker_log_rejects_bad_metrics_and_writes_nothing)
{
    char *dir = tmpdir();
    em_tracker *t = em_tracker_open("r", &(em_tracker_config){.log_with = EM_TRACK_ALL, .logging_dir = dir});
    CHECK_NOTNULL(t);
    CHECK_ERR(em_tracker_log(t, 1, 2, (em_metric[]){{"loss", 1}, {"loss", 2}}), EM_ERR_ARG,
              "tag \"loss\" is given twice (metrics 0 and 1)");
    CHECK_ERR(em_tracker_log(t, 1, 1, (em_metric[]){{"step", 1}}), EM_ERR_ARG, "tagged \"step\"");
    CHECK_ERR(em_tracker_log(t, 1, 1, (em_metric[]){{"", 1}}), EM_ERR_ARG, "metric 0 has an empty tag");
    CHECK_ERR(em_tracker_log(t, 1, 1, (em_metric[]){{NULL, 1}}), EM_ERR_ARG, "metric 0 has a NULL tag");
    CHECK_ERR(em_tracker_log(t, -1, 1, (em_metric[]){{"a", 1}}), EM_ERR_ARG, "step -1 is negative");
    CHECK_ERR(em_tracker_log(t, 1, -2, NULL), EM_ERR_ARG, "n -2 is negative");
    CHECK_ERR(em_tracker_log(t, 1, 1, NULL), EM_ERR_ARG, "metrics is NULL");
    CHECK_ERR(em_tracker_log(NULL, 1, 0, NULL), EM_ERR_ARG, "tracker is NULL");
    char tb[PATH_MAX];
    snprintf(tb, sizeof tb, "%s", em_tracker_path(t, EM_TRACK_TENSORBOARD));
    CHECK_OK(em_tracker_close(t));
    struct stat sb;
    CHECK(stat(th_path(dir, "r/metrics.jsonl"), &sb) == 0 && sb.st_size == 0);
    tb_event ev[4];
    char why[256];
    CHECK(read_events(tb, ev, 4, why, sizeof why) == 1); /* the version record only */
}

TEST(test_tracker_open_names_a_logging_dir_that_is_a_file)
{
    char *dir = tmpdir();
    const char *file = th_path(dir, "file");
    th_write_file(file, "x", 1);
    CHECK_ERR(
        em_tracker_open("r", &(em_tracker_config){.log_with = EM_TRACK_TENSORBOARD, .logging_dir = file}),
        EM_ERR_IO, "is not a directory");
}

TEST(test_tracker_open_refuses_a_fifo_without_waiting)
{
    char *dir = tmpdir();
    const char *fifo = th_path(dir, "fifo");
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK_ERR(em_tracker_open("r", &(em_tracker_config){.log_with = EM_TRACK_JSONL, .jsonl_path = fifo}),
              EM_ERR_IO, "not a regular file");
}

/* A write that fails part-way (here: the file size limit) is an error
 * naming the file, and the file is cut back to its last whole line. */
TEST(test_tracker_failed_write_leaves_only_whole_records)
{
    char *dir = tmpdir();
    const char *path = th_path(dir, "m.jsonl");
    em_tracker *t =
        em_tracker_open("r", &(em_tracker_config){.log_with = EM_TRACK_JSONL, .jsonl_path = path});
    CHECK_NOTNULL(t);
    CHECK_OK(em_tracker_log(t, 1, 1, (em_metric[]){{"loss", 1}}));
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {.rlim_cur = (rlim_t)sb.st_size + 10, .rlim_max = RLIM_INFINITY};
    CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0);
    CHECK_ERR(em_tracker_log(t, 2, 1, (em_metric[]){{"a_long_tag_name", 2}}), EM_ERR_IO, path);
    rl.rlim_cur = RLIM_INFINITY;
    CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0);
    char *got = text_of(path);
    CHECK(!strcmp(got, "{\"step\": 1, \"loss\": 1}\n"));
    free(got);
    CHECK_OK(em_tracker_log(t, 3, 1, (em_metric[]){{"loss", 3}})); /* goes on after the failure */
    CHECK_OK(em_tracker_close(t));
    got = text_of(path);
    CHECK(!strcmp(got, "{\"step\": 1, \"loss\": 1}\n{\"step\": 3, \"loss\": 3}\n"));
    free(got);
}

TEST(test_tracker_parse_reads_names_and_lists)
{
    int v = -1;
    CHECK_OK(em_tracker_parse("tensorboard", &v));
    CHECK(v == EM_TRACK_TENSORBOARD);
    CHECK_OK(em_tracker_parse("jsonl,tensorboard", &v));
    CHECK(v == EM_TRACK_ALL);
    CHECK_OK(em_tracker_parse("all", &v));
    CHECK(v == EM_TRACK_ALL);
    CHECK_OK(em_tracker_parse("none", &v));
    CHECK(v == 0);
    v = 5;
    CHECK_ERR(em_tracker_parse("wandb", &v), EM_ERR_ARG, "log_with 'wandb'");
    CHECK_ERR(em_tracker_parse("jsonl,", &v), EM_ERR_ARG, "log_with 'jsonl,'");
    CHECK(v == 5);
}

/* ---- the Accelerator ------------------------------------------------------------------ */

TEST(test_accel_log_before_init_trackers_is_an_error)
{
    no_user_config();
    em_accelerator *a = em_accelerator_new(NULL);
    CHECK_NOTNULL(a);
    CHECK_ERR(em_accel_log(a, 0, 1, (em_metric[]){{"loss", 1}}), EM_ERR_ARG,
              "call em_accel_init_trackers first");
    CHECK_OK(em_accel_end_training(a)); /* nothing open: fine */
    em_accelerator_free(a);
}

TEST(test_accel_trackers_write_where_the_config_says)
{
    no_user_config();
    char *dir = tmpdir();
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.log_with = EM_TRACK_ALL, .logging_dir = dir});
    CHECK_NOTNULL(a);
    CHECK_OK(em_accel_init_trackers(a, "proj", NULL));
    CHECK_ERR(em_accel_init_trackers(a, "proj", NULL), EM_ERR_ARG, "already open");
    CHECK_OK(em_accel_log(a, 5, 1, (em_metric[]){{"loss", 0.25}}));
    CHECK_OK(em_accel_log(a, -1, 1, (em_metric[]){{"loss", 0.5}})); /* the step count: 0 */
    CHECK_ERR(em_accel_log(a, 6, 1, (em_metric[]){{"step", 1}}), EM_ERR_ARG, "em_accel_log: metric 0");
    CHECK_OK(em_accel_end_training(a));
    CHECK_ERR(em_accel_log(a, 7, 1, (em_metric[]){{"loss", 1}}), EM_ERR_ARG, "init_trackers first");
    em_accelerator_free(a);
    char *got = text_of(th_path(dir, "proj/metrics.jsonl"));
    CHECK(!strcmp(got, "{\"step\": 5, \"loss\": 0.25}\n{\"step\": 0, \"loss\": 0.5}\n"));
    free(got);
    tb_event ev[4];
    char why[256];
    CHECK(read_events(event_file(th_path(dir, "proj")), ev, 4, why, sizeof why) == 3);
}

/* As Accelerate's ProjectConfiguration: without a logging_dir the runs go
 * into the project directory. */
TEST(test_accel_trackers_default_to_the_project_dir)
{
    no_user_config();
    char *dir = tmpdir();
    em_accelerator *a =
        em_accelerator_new(&(em_accel_config){.log_with = EM_TRACK_JSONL, .project_dir = dir});
    CHECK_NOTNULL(a);
    CHECK_OK(em_accel_init_trackers(a, "proj", NULL));
    CHECK_OK(em_accel_log(a, 3, 1, (em_metric[]){{"loss", 2}}));
    em_accelerator_free(a);
    char *got = text_of(th_path(dir, "proj/metrics.jsonl"));
    CHECK(!strcmp(got, "{\"step\": 3, \"loss\": 2}\n"));
    free(got);
}

TEST(test_accel_init_trackers_config_overrides_the_accelerators)
{
    no_user_config();
    char *dir = tmpdir(), other[PATH_MAX];
    th_pathf(other, sizeof other, "%s/other", dir);
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.log_with = EM_TRACK_ALL, .logging_dir = dir});
    CHECK_OK(em_accel_init_trackers(a, "p",
                                    &(em_tracker_config){.log_with = EM_TRACK_JSONL, .logging_dir = other}));
    CHECK_OK(em_accel_log(a, 1, 1, (em_metric[]){{"loss", 1}}));
    em_accelerator_free(a); /* closes the trackers */
    char *got = text_of(th_path(other, "p/metrics.jsonl"));
    CHECK(!strcmp(got, "{\"step\": 1, \"loss\": 1}\n"));
    free(got);
    CHECK(count_event_files(th_path(other, "p")) == 0);
    struct stat sb;
    CHECK(stat(th_path(dir, "p"), &sb) != 0);
}

TEST(test_accel_log_with_comes_from_EMBER_LOG_WITH)
{
    no_user_config();
    char *dir = tmpdir();
    setenv("EMBER_LOG_WITH", "jsonl", 1);
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.logging_dir = dir});
    CHECK_NOTNULL(a);
    CHECK_OK(em_accel_init_trackers(a, "e", NULL));
    CHECK_OK(em_accel_log(a, 2, 1, (em_metric[]){{"loss", 1}}));
    CHECK_OK(em_accel_end_training(a));
    em_accelerator_free(a);
    char *got = text_of(th_path(dir, "e/metrics.jsonl"));
    CHECK(!strcmp(got, "{\"step\": 2, \"loss\": 1}\n"));
    free(got);
    setenv("EMBER_LOG_WITH", "mlflow", 1);
    CHECK_ERR(em_accelerator_new(NULL), EM_ERR_ARG, "EMBER_LOG_WITH='mlflow'");
    unsetenv("EMBER_LOG_WITH");
    CHECK_ERR(em_accelerator_new(&(em_accel_config){.log_with = 16}), EM_ERR_ARG, "log_with 0x10");
}

TEST(test_accel_without_log_with_logs_nowhere_without_error)
{
    no_user_config();
    char *dir = tmpdir();
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.logging_dir = dir});
    CHECK_OK(em_accel_init_trackers(a, "quiet", NULL));
    CHECK_OK(em_accel_log(a, 1, 1, (em_metric[]){{"loss", 1}}));
    CHECK_OK(em_accel_end_training(a));
    em_accelerator_free(a);
    struct stat sb;
    CHECK(stat(th_path(dir, "quiet"), &sb) != 0);
}

/* Two ranks log; only rank 0's records reach the files, and a bad call
 * fails on both. */
static void two_ranks(int rank, int world, void *ctx)
{
    (void)world;
    no_user_config();
    em_accelerator *a = em_accelerator_new(&(em_accel_config){.log_with = EM_TRACK_ALL, .logging_dir = ctx});
    CHECK_NOTNULL(a);
    CHECK_OK(em_accel_init_trackers(a, "ddp", NULL));
    CHECK_OK(em_accel_log(a, 1, 1, (em_metric[]){{"rank", (double)rank}}));
    CHECK_ERR(em_accel_log(a, 1, 1, (em_metric[]){{"", 1}}), EM_ERR_ARG, "empty tag");
    CHECK_OK(em_accel_end_training(a));
    CHECK_OK(em_accel_wait_for_everyone(a));
    em_accelerator_free(a);
}

TEST(test_accel_trackers_write_on_the_main_process_only)
{
    char *dir = tmpdir();
    TH_RANKS_ENV(2, two_ranks, dir);
    char *got = text_of(th_path(dir, "ddp/metrics.jsonl"));
    CHECK(!strcmp(got, "{\"step\": 1, \"rank\": 0}\n"));
    free(got);
    CHECK(count_event_files(th_path(dir, "ddp")) == 1);
}
