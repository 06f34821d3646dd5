/* test_surface.c — what ember shows the outside, and which way its insides
 * depend:
 *   - libember.so exports exactly the functions the public headers (those
 *     in include/ember/) declare, all named em_*: the symbol table is read
 *     from the built library's ELF dynamic symbols (no nm needed), the
 *     declarations from the headers as the C compiler preprocesses them;
 *   - the examples link that shared library (they are what users copy);
 *   - scripts/check_layers.sh passes on this tree and catches an upward
 *     include planted in a copy of it, and a stale entry in its known list.
 * Fast: one 0.6 MB file read, one header scan, a few runs of a bash script. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

/* After ember's headers: <elf.h> defines machine numbers as EM_* macros,
 * EM_CUDA among them, which would rename ember's enumerators. */
#include <elf.h>

#define LIBEMBER EMBER_BUILD_DIR "/libember.so"

/* ---- a list of names ------------------------------------------------------------ */
typedef struct names {
    char **v;
    int n, cap;
} names;

static void names_add(names *l, const char *s, size_t len)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
        if (!l->v) th_fail(__FILE__, __LINE__, "out of memory");
    }
    l->v[l->n] = strndup(s, len);
    if (!l->v[l->n]) th_fail(__FILE__, __LINE__, "out of memory");
    l->n++;
}

static void names_free(names *l)
{
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    *l = (names){0};
}

static bool names_has(const names *l, const char *s)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i], s)) return true;
    return false;
}

/* ---- reading an ELF file's dynamic symbols and needed libraries ----------------- */
static unsigned char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(n > 0 ? (size_t)n + 1 : 1);
    if (!buf || n <= 0 || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* The section of type `type` in a 64-bit ELF image, or NULL. */
static const Elf64_Shdr *elf_section(const unsigned char *img, size_t len, uint32_t type)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    if (len < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) || eh->e_ident[EI_CLASS] != ELFCLASS64)
        th_fail(__FILE__, __LINE__, "not a 64-bit ELF file");
    if (eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) > len)
        th_fail(__FILE__, __LINE__, "ELF section table out of bounds");
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++)
        if (sh[i].sh_type == type) return &sh[i];
    return NULL;
}

static const Elf64_Shdr *elf_linked(const unsigned char *img, const Elf64_Shdr *s)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    if (s->sh_link >= eh->e_shnum) th_fail(__FILE__, __LINE__, "ELF sh_link out of range");
    return (const Elf64_Shdr *)(img + eh->e_shoff) + s->sh_link;
}

/* The symbols a shared library exports: defined (not UND), global or weak,
 * visible from outside. Linker-made symbols are included too, so nothing
 * leaves unseen. */
static names exported_symbols(const char *path)
{
    size_t len;
    unsigned char *img = read_file(path, &len);
    if (!img) th_fail(__FILE__, __LINE__, "cannot read %s", path);
    const Elf64_Shdr *ds = elf_section(img, len, SHT_DYNSYM);
    if (!ds) th_fail(__FILE__, __LINE__, "%s has no dynamic symbol table", path);
    const Elf64_Shdr *str = elf_linked(img, ds);
    if (ds->sh_offset + ds->sh_size > len || str->sh_offset + str->sh_size > len)
        th_fail(__FILE__, __LINE__, "ELF tables out of bounds");
    const Elf64_Sym *sym = (const Elf64_Sym *)(img + ds->sh_offset);
    const char *strs = (const char *)img + str->sh_offset;
    names out = {0};
    for (size_t i = 1; i < ds->sh_size / sizeof *sym; i++) {
        int bind = ELF64_ST_BIND(sym[i].st_info), vis = ELF64_ST_VISIBILITY(sym[i].st_other);
        if (sym[i].st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK)) continue;
        if (vis == STV_HIDDEN || vis == STV_INTERNAL) continue;
        if (sym[i].st_name >= str->sh_size) th_fail(__FILE__, __LINE__, "ELF name out of bounds");
        const char *name = strs + sym[i].st_name;
        names_add(&out, name, strlen(name));
    }
    free(img);
    return out;
}

/* The DT_NEEDED entries of an executable or library. */
static names needed_libraries(const char *path)
{
    size_t len;
    unsigned char *img = read_file(path, &len);
    if (!img) th_fail(__FILE__, __LINE__, "cannot read %s", path);
    const Elf64_Shdr *dyn = elf_section(img, len, SHT_DYNAMIC);
    names out = {0};
    if (dyn) {
        const Elf64_Shdr *str = elf_linked(img, dyn);
        const Elf64_Dyn *d = (const Elf64_Dyn *)(img + dyn->sh_offset);
        for (size_t i = 0; i < dyn->sh_size / sizeof *d && d[i].d_tag != DT_NULL; i++)
            if (d[i].d_tag == DT_NEEDED && d[i].d_un.d_val < str->sh_size) {
                const char *name = (const char *)img + str->sh_offset + d[i].d_un.d_val;
                names_add(&out, name, strlen(name));
            }
    }
    free(img);
    return out;
}

/* ---- what the public headers declare --------------------------------------------- */
static bool ident_char(char c)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* Adds the name a top-level declaration `s` (text outside braces, up to its
 * ';') declares, unless it is a typedef, static or not a declaration. A
 * function's name is the first identifier followed by '(' (attributes come
 * after the parameters); a variable's is the last identifier. */
static void classify(const char *s, size_t n, names *out)
{
    char buf[4096];
    if (n >= sizeof buf) n = sizeof buf - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    const char *p = buf;
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    if (!*p) return;
    for (const char *q = p; (q = strstr(q, "static")); q += 6)
        if ((q == buf || !ident_char(q[-1])) && !ident_char(q[6])) return;
    if (!strncmp(p, "typedef", 7) && !ident_char(p[7])) return;
    if (!strncmp(p, "_Static_assert", 14) && !ident_char(p[14])) return;
    for (const char *q = p; *q; q++) {
        if (!ident_char(*q) || (q > p && ident_char(q[-1]))) continue;
        const char *e = q;
        while (ident_char(*e)) e++;
        const char *after = e;
        while (*after == ' ' || *after == '\t' || *after == '\n') after++;
        if (*after == '(') {
            names_add(out, q, (size_t)(e - q));
            return;
        }
        q = e - 1;
    }
    /* no '(': a variable if declared extern (a struct/enum definition or a
     * forward declaration otherwise); its name is the last identifier before
     * any '[' or '=' */
    if (strncmp(p, "extern", 6) || ident_char(p[6])) return;
    const char *end = p + strcspn(p, "[=");
    while (end > p && !ident_char(end[-1])) end--;
    const char *b = end;
    while (b > p && ident_char(b[-1])) b--;
    if (end > b) names_add(out, b, (size_t)(end - b));
}

/* The functions and variables a C header declares at file scope. Crude but
 * enough for ember's headers: comments, string literals and preprocessor
 * lines are dropped, and the `extern "C" {` block inside `#ifdef
 * __cplusplus` with them; brace bodies (struct, enum, inline functions) are
 * skipped; what stays is split at ';'. */
static void scan_declarations(const char *text, names *out)
{
    size_t cap = strlen(text) + 1, n = 0;
    char *stmt = malloc(cap);
    if (!stmt) th_fail(__FILE__, __LINE__, "out of memory");
    int depth = 0;
    bool line_start = true, in_cplusplus = false;
    for (const char *p = text; *p;) {
        if (line_start) {
            const char *q = p;
            while (*q == ' ' || *q == '\t') q++;
            if (*q == '#') { /* a preprocessor line, with its continuations */
                if (!strncmp(q, "#ifdef __cplusplus", 18)) in_cplusplus = true;
                if (!strncmp(q, "#endif", 6)) in_cplusplus = false;
                while (*q && !(*q == '\n' && q[-1] != '\\')) q++;
                p = *q ? q + 1 : q;
                continue;
            }
            line_start = false;
        }
        if (*p == '\n') line_start = true;
        if (in_cplusplus) {
            p++;
            continue;
        }
        if (p[0] == '/' && p[1] == '*') {
            const char *e = strstr(p + 2, "*/");
            p = e ? e + 2 : p + strlen(p);
            continue;
        }
        if (p[0] == '/' && p[1] == '/') {
            p += strcspn(p, "\n");
            continue;
        }
        if (*p == '"' || *p == '\'') {
            char quote = *p++;
            while (*p && *p != quote) p += (*p == '\\' && p[1]) ? 2 : 1;
            if (*p) p++;
            continue;
        }
        if (*p == '{') {
            depth++;
        } else if (*p == '}') {
            depth--;
            /* the end of a function body ends its definition (no ';' follows) */
            size_t k = n;
            while (k > 0 && (stmt[k - 1] == ' ' || stmt[k - 1] == '\n' || stmt[k - 1] == '\t')) k--;
            if (depth == 0 && k > 0 && stmt[k - 1] == ')') {
                classify(stmt, n, out);
                n = 0;
            }
        } else if (depth == 0 && *p == ';') {
            classify(stmt, n, out);
            n = 0;
        } else if (depth == 0) {
            stmt[n++] = *p;
        }
        p++;
    }
    free(stmt);
    if (depth != 0) th_fail(__FILE__, __LINE__, "unbalanced braces in a public header");
}

/* Every function and variable the headers in include/ember/ declare, read
 * from the headers after the build's C compiler preprocessed them (-E), so
 * declarations a macro writes count too; the line markers say which file
 * each line came from, and only include/ember/'s lines are kept (a public
 * header may include <stdio.h>). */
static names public_declarations(void)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "for h in '%s'/include/ember/*.h; do printf '#include \"%%s\"\\n' \"$h\"; done"
             " | %s -E -x c -I'%s'/include -",
             EMBER_SOURCE_DIR, EMBER_CC, EMBER_SOURCE_DIR);
    FILE *p = popen(cmd, "r");
    if (!p) th_fail(__FILE__, __LINE__, "cannot run %s", cmd);
    size_t n = 0, cap = 1 << 16;
    char *text = malloc(cap);
    for (size_t got; text && (got = fread(text + n, 1, cap - n - 1, p)) > 0;) {
        n += got;
        if (n + 1 == cap) text = realloc(text, cap *= 2);
    }
    int rc = pclose(p);
    if (!text) th_fail(__FILE__, __LINE__, "out of memory");
    text[n] = '\0';
    if (rc != 0 || n == 0) th_fail(__FILE__, __LINE__, "preprocessing the public headers failed: %s", cmd);
    /* keep the lines of include/ember/ (after a marker `# N "FILE" ...`) */
    size_t k = 0;
    bool keep = false;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) + 1 : strlen(line);
        if (line[0] == '#') {
            char *q = memchr(line, '"', len);
            char *q2 = q ? memchr(q + 1, '"', len - (size_t)(q + 1 - line)) : NULL;
            if (q2) {
                *q2 = '\0';
                keep = strstr(q + 1, "/include/ember/") != NULL;
            }
        } else if (keep) {
            memmove(text + k, line, len);
            k += len;
        }
        line += len;
    }
    text[k] = '\0';
    names out = {0};
    scan_declarations(text, &out);
    free(text);
    return out;
}

static names library_exports(void)
{
    if (access(LIBEMBER, R_OK) != 0) SKIP("no libember.so in the build directory (a static-only build)");
    return exported_symbols(LIBEMBER);
}

/* Fails listing up to 40 names (and how many in all). */
static void fail_listing(int line, const char *what, const names *bad)
{
    char list[4096] = "";
    size_t k = 0;
    for (int i = 0; i < bad->n && i < 40 && k < sizeof list - 80; i++)
        k += (size_t)snprintf(list + k, sizeof list - k, " %s", bad->v[i]);
    th_fail(__FILE__, line, "%d %s:%s%s", bad->n, what, list, bad->n > 40 ? " ..." : "");
}

/* ---- the exported surface -------------------------------------------------------- */

TEST(test_libember_exports_only_em_names)
{
    names sym = library_exports(), bad = {0};
    for (int i = 0; i < sym.n; i++)
        if (strncmp(sym.v[i], "em_", 3)) names_add(&bad, sym.v[i], strlen(sym.v[i]));
    if (bad.n)
        fail_listing(__LINE__,
                     "symbols exported from libember.so are not em_* (internal code builds with "
                     "-fvisibility=hidden; only include/ember/*.h marks names visible)",
                     &bad);
    CHECK(sym.n > 0);
    names_free(&sym);
}

TEST(test_libember_exports_only_what_the_public_headers_declare)
{
    names sym = library_exports(), decl = public_declarations(), bad = {0};
    for (int i = 0; i < sym.n; i++)
        if (!names_has(&decl, sym.v[i])) names_add(&bad, sym.v[i], strlen(sym.v[i]));
    if (bad.n)
        fail_listing(__LINE__, "symbols exported from libember.so are declared in no public header", &bad);
    names_free(&sym);
    names_free(&decl);
}

TEST(test_libember_exports_every_function_the_public_headers_declare)
{
    names sym = library_exports(), decl = public_declarations(), bad = {0};
    for (int i = 0; i < decl.n; i++)
        if (!names_has(&sym, decl.v[i])) names_add(&bad, decl.v[i], strlen(decl.v[i]));
    if (bad.n)
        fail_listing(__LINE__,
                     "names declared in include/ember/*.h are not exported from libember.so (not "
                     "defined, or defined in a file that does not include the header)",
                     &bad);
    names_free(&sym);
    names_free(&decl);
}

TEST(test_public_header_scan_finds_declarations_and_skips_types_and_inlines)
{
    const char *h = "/* em_commented(void); */\n"
                    "#define EM_MACRO(x) em_macro_call(x)\n"
                    "#ifdef __cplusplus\nextern \"C\" {\n#endif\n"
                    "typedef struct em_thing { int (*fn)(void *); int a; } em_thing;\n"
                    "typedef void (*em_callback)(int);\n"
                    "enum em_kind { EM_A, EM_B };\n"
                    "_Static_assert(sizeof(int) == 4, \"int\");\n"
                    "em_thing *em_thing_new(int n, const char *name);\n"
                    "em_status em_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));\n"
                    "static inline int em_inline_helper(int x) { return x + 1; }\n"
                    "int em_after_inline(void);\n"
                    "extern const int em_table[4];\n"
                    "#ifdef __cplusplus\n}\n#endif\n";
    names got = {0};
    scan_declarations(h, &got);
    const char *want[] = {"em_thing_new", "em_log", "em_after_inline", "em_table"};
    if (got.n != 4)
        fail_listing(__LINE__, "names found, want em_thing_new em_log em_after_inline em_table", &got);
    for (int i = 0; i < 4; i++) CHECK(!strcmp(got.v[i], want[i]));
    names_free(&got);
}

TEST(test_examples_link_the_shared_library)
{
    const char *bins[] = {EMBER_BUILD_DIR "/examples/gpt", EMBER_BUILD_DIR "/examples/classifier"};
    for (int i = 0; i < 2; i++) {
        if (access(bins[i], R_OK) != 0) SKIP("examples not built");
        names need = needed_libraries(bins[i]);
        if (!names_has(&need, "libember.so"))
            fail_listing(__LINE__, "libraries the example needs, and libember.so is not one", &need);
        names_free(&need);
    }
}

/* ---- the layering check ---------------------------------------------------------- */
#define CHECK_LAYERS "/scripts/check_layers.sh"

/* A copy of the parts of the tree the layering check reads, in a fresh
 * directory (its path into dir, n bytes). */
static void copy_tree(char *dir, size_t n)
{
    th_tmpdir(dir, n, "ember-layers");
    th_run_result *r =
        th_run("/bin/sh", "-c",
               "cd \"$0\" && cp -r tensor autograd nn optim data amp dist tools include examples scripts "
               "\"$1\"/",
               EMBER_SOURCE_DIR, dir, NULL);
    if (r->status != 0) th_fail(__FILE__, __LINE__, "copying the tree failed: %s", r->err);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) th_fail(__FILE__, __LINE__, "cannot write %s", path);
}

/* Runs the copy of the script in root on root; the result is a copy (the
 * next th_run overwrites th_run's). */
static th_run_result *check_layers(const char *root)
{
    static th_run_result res;
    char script[1024];
    th_pathf(script, sizeof script, "%s" CHECK_LAYERS, root);
    res = *th_run("/bin/bash", script, root, NULL);
    return &res;
}

TEST(test_layers_check_passes_on_this_tree)
{
    th_run_result *r = check_layers(EMBER_SOURCE_DIR);
    if (r->status != 0) th_fail(__FILE__, __LINE__, "scripts/check_layers.sh failed:\n%s%s", r->out, r->err);
    CHECK(strstr(r->out, "check_layers: OK"));
    /* the bottom layer reaches into no other (issue 14: the ops no longer
     * call autocast or the tape up in amp/ and autograd/) */
    CHECK(strstr(r->out, "  tensor    includes only itself\n"));
    CHECK(strstr(r->out, "0 known upward"));
}

TEST(test_layers_check_catches_a_planted_upward_include)
{
    char dir[PATH_MAX], path[PATH_MAX];
    copy_tree(dir, sizeof dir);
    th_pathf(path, sizeof path, "%s/nn/planted.c", dir);
    write_text(path, "/* planted: nn reaching up into dist */\n#include \"dist/dist_impl.h\"\n");
    th_run_result *r = check_layers(dir);
    CHECK_EXIT(r, 1);
    if (!strstr(r->out, "NEW upward include: nn/planted.c -> dist/dist_impl.h"))
        th_fail(__FILE__, __LINE__, "the planted include is not named:\n%s", r->out);
    CHECK(strstr(r->out, "FAILED (1 new upward, 0 stale known)"));
}

TEST(test_layers_check_catches_an_upward_include_through_a_relative_path)
{
    char dir[PATH_MAX], path[PATH_MAX];
    copy_tree(dir, sizeof dir);
    th_pathf(path, sizeof path, "%s/tensor/planted.h", dir);
    write_text(path, "#include \"../autograd/../optim/optim_impl.h\"\n#include <ember/nn.h>\n");
    th_run_result *r = check_layers(dir);
    CHECK_EXIT(r, 1);
    if (!strstr(r->out, "NEW upward include: tensor/planted.h -> optim/optim_impl.h") ||
        !strstr(r->out, "NEW upward include: tensor/planted.h -> include/ember/nn.h"))
        th_fail(__FILE__, __LINE__, "the planted includes are not both named:\n%s", r->out);
}

TEST(test_layers_check_fails_when_a_known_violation_is_gone)
{
    char dir[PATH_MAX], path[PATH_MAX];
    copy_tree(dir, sizeof dir);
    th_pathf(path, sizeof path, "%s/scripts/check_layers.known", dir);
    FILE *f = fopen(path, "a");
    if (!f) th_fail(__FILE__, __LINE__, "cannot open %s", path);
    fputs("data/loader.c amp/amp_impl.h a fix that already happened\n", f);
    fclose(f);
    th_run_result *r = check_layers(dir);
    CHECK_EXIT(r, 1);
    if (!strstr(r->out, "STALE entry in scripts/check_layers.known: data/loader.c -> amp/amp_impl.h"))
        th_fail(__FILE__, __LINE__, "the stale entry is not named:\n%s", r->out);
}

TEST(test_layers_check_keeps_examples_to_the_public_headers)
{
    char dir[PATH_MAX], path[PATH_MAX];
    copy_tree(dir, sizeof dir);
    th_pathf(path, sizeof path, "%s/examples/planted.c", dir);
    write_text(path, "#include \"ember/ember.h\"\n#include \"../tensor/tensor_impl.h\"\n");
    th_run_result *r = check_layers(dir);
    CHECK_EXIT(r, 1);
    if (!strstr(r->out, "NEW upward include: examples/planted.c -> tensor/tensor_impl.h"))
        th_fail(__FILE__, __LINE__, "the example's internal include is not named:\n%s", r->out);
    CHECK(strstr(r->out, "FAILED (1 new upward, 0 stale known)"));
}
