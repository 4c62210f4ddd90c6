/* `sluice verify DIR`: a pack's files against its manifest's sizes and hashes and their own
 * checksums; --upgrade brings an older pack to the current format. */
#include <getopt.h>
#include <stdio.h>

#include "cli/cli.h"

static const char verify_help[] =
    "usage: sluice verify DIR [--upgrade]\n"
    "\n"
    "Checks every file a sluice pack needs (derived from its config, whatever the\n"
    "manifest lists) against the sizes and SHA-256 hashes in its manifest and, from\n"
    "format 2 on, every header, tensor, expert and n-gram row against its own\n"
    "checksum; names the first file (and layer and expert) that differs.\n"
    "\n"
    "  --upgrade    then rewrite an older pack (format 1, no checksums) in the\n"
    "               current format, adding the checksums of its verified bytes;\n"
    "               each file is replaced by rename, the manifest last\n"
    "  -h, --help   this help\n";

int cli_verify(int argc, char **argv) {
    static const struct option opts[] = {
        {"upgrade", no_argument, 0, 'u'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int upgrade = 0;
    if (cli_getopt_start(argc, argv, ":h", opts)) return 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': fputs(verify_help, stdout); return 0;
        case 'u': upgrade = 1; break;
        default: return cli_error("unknown option '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (argc - optind != 1) return cli_error("verify needs one DIR (see --help)");
    const char *dir = argv[optind];
    sl_error err = {0};
    const int32_t before = sl_pack_version(dir);
    if (upgrade ? sl_pack_upgrade(dir, cli_progress, NULL, &err)
                : sl_verify(dir, cli_progress, NULL, &err))
        return cli_error("%s", err.msg);
    const int32_t version = sl_pack_version(dir);
    if (upgrade && before != version)
        printf("%s: OK, upgraded from format %d to %d\n", dir, before, version);
    else
        printf("%s: OK (format %d%s)\n", dir, version,
               version < 2 ? ", no checksums: 'sluice verify --upgrade' adds them" : "");
    return 0;
}
