/* Without libFuzzer: replays every file of the given directories through the target. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
    int runs = 0;
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
            FILE *f = fopen(path, "rb");
            if (!f) continue;
            uint8_t *buf = malloc(1 << 20);
            size_t n = fread(buf, 1, 1 << 20, f);
            fclose(f);
            LLVMFuzzerTestOneInput(buf, n);
            free(buf);
            runs++;
        }
        if (d) closedir(d);
    }
    printf("replayed %d inputs\n", runs);
    return 0;
}
