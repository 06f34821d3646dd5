/* test_install.c — ember as an installed library: `meson install` into a
 * temporary DESTDIR, then a program outside the tree built with the real
 * pkg-config (`cc prog.c $(pkg-config --cflags --libs ember)`, the README's
 * "Your own program") and run against the installed libember.so. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* the README's example program, in short: a gradient through the public API */
static const char *const PROGRAM =
    "#include <ember/ember.h>\n"
    "#include <stdio.h>\n"
    "int main(void)\n"
    "{\n"
    "    em_scope s = em_scope_begin();\n"
    "    em_tensor *x = em_full(EM_F32, EM_SHAPE(2, 3), 2.0);\n"
    "    if (!x || em_set_requires_grad(x, true)) return 1;\n"
    "    em_tensor *y = em_sum(em_mul(x, x), 0, NULL, false);\n"
    "    if (!y || em_backward(y, NULL)) { fprintf(stderr, \"%s\\n\", em_last_error()); return 1; }\n"
    "    printf(\"loss %g grad %g\\n\", em_item(y), em_item(em_sum(em_grad(x), 0, NULL, false)));\n"
    "    em_scope_end(s);\n"
    "    return 0;\n"
    "}\n";

/* Installs the build into a fresh DESTDIR (its path into dir, n bytes) and
 * returns the directory holding the installed ember.pc (static buffer). */
static const char *install_into(char *dir, size_t n)
{
    th_tmpdir(dir, n, "ember-install");
    th_run_result *r =
        th_run("/bin/sh", "-c", "meson install -C \"$0\" --destdir \"$1\" --no-rebuild --quiet",
               EMBER_BUILD_DIR, dir, NULL);
    if (r->status != 0) th_fail(__FILE__, __LINE__, "meson install failed:\n%s%s", r->out, r->err);
    r = th_run("/bin/sh", "-c", "find \"$0\" -name ember.pc", dir, NULL);
    static char pcdir[16384];
    char *nl = strchr(r->out, '\n');
    if (r->status != 0 || !nl || nl == r->out)
        th_fail(__FILE__, __LINE__, "no ember.pc installed under %s", dir);
    *nl = 0;
    char *slash = strrchr(r->out, '/');
    *slash = 0;
    snprintf(pcdir, sizeof pcdir, "%s", r->out);
    return pcdir;
}

TEST(test_installed_library_builds_and_runs_a_program_through_pkg_config)
{
    if (em_build().sanitizers) SKIP("an ASan-built libember.so needs the program built with ASan too");
    th_run_result *r =
        th_run("/bin/sh", "-c", "command -v pkg-config && command -v meson && command -v cc", NULL);
    if (r->status != 0) SKIP("pkg-config, meson or cc is not installed");
    char dir[PATH_MAX], src[PATH_MAX], prog[PATH_MAX];
    const char *pcdir = install_into(dir, sizeof dir);
    th_pathf(src, sizeof src, "%s/prog.c", dir);
    th_pathf(prog, sizeof prog, "%s/prog", dir);
    FILE *f = fopen(src, "w");
    if (!f) th_fail(__FILE__, __LINE__, "cannot write %s", src);
    fputs(PROGRAM, f);
    fclose(f);
    /* PKG_CONFIG_SYSROOT_DIR puts the DESTDIR in front of the -I and -L paths */
    r = th_run(
        "/bin/sh", "-c",
        "cc \"$2\" $(PKG_CONFIG_SYSROOT_DIR=\"$0\" PKG_CONFIG_PATH=\"$1\" pkg-config --cflags --libs ember) "
        "-o \"$3\"",
        dir, pcdir, src, prog, NULL);
    if (r->status != 0)
        th_fail(__FILE__, __LINE__, "building against the installed ember failed:\n%s", r->err);
    /* libdir is where ember.pc's pkgconfig/ sits */
    static char libdir[16384];
    snprintf(libdir, sizeof libdir, "%s", pcdir);
    *strrchr(libdir, '/') = 0;
    r = th_run("/usr/bin/env", "-u", "LD_LIBRARY_PATH", "sh", "-c", "LD_LIBRARY_PATH=\"$0\" \"$1\"", libdir,
               prog, NULL);
    if (r->status != 0)
        th_fail(__FILE__, __LINE__, "the program failed (%d):\n%s%s", r->status, r->out, r->err);
    bool right = strstr(r->out, "loss 24 grad 24") != NULL;
    if (!right) th_fail(__FILE__, __LINE__, "the program printed: %s", r->out);
}

TEST(test_install_puts_only_the_public_headers_in_include_ember)
{
    if (em_build().sanitizers) SKIP("checked in the plain build");
    th_run_result *r = th_run("/bin/sh", "-c", "command -v meson", NULL);
    if (r->status != 0) SKIP("meson is not installed");
    char dir[PATH_MAX];
    install_into(dir, sizeof dir);
    static char got[16384]; /* th_run's result is overwritten by the next call */
    r = th_run("/bin/sh", "-c",
               "cd \"$0\" && find . -path '*/include/*' -type f | sed 's|.*/include/||' | sort", dir, NULL);
    snprintf(got, sizeof got, "%s", r->out);
    r = th_run("/bin/sh", "-c", "cd \"$0\"/include && find ember -type f | sort", EMBER_SOURCE_DIR, NULL);
    if (strcmp(got, r->out))
        th_fail(__FILE__, __LINE__, "installed headers:\n%s\nwant include/ember's:\n%s", got, r->out);
    CHECK(strstr(got, "ember/ember.h\n") != NULL);
}
