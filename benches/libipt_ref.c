/* Reference for `cargo xtask bench-decode`: Intel's libipt on the same trace and code.
 *
 *   libipt_ref TRACE FILE:OFFSET:SIZE:ADDR...
 *
 * Each section maps SIZE bytes of FILE from OFFSET at ADDR (SIZE 0: to the end of the
 * file); later sections over earlier ones, as ptxed's `--raw`.
 *
 * Times (1) a packet walk with libipt's packet decoder (what ptdump does, the lower
 * bound of any decoder) and (2) a full decode with its block decoder (what
 * `ptxed --block-decoder --stat --stat:insn` does, without printing), counting packets,
 * instructions, blocks, events and errors. Prints one `key=value` line per pass.
 * Build: cc -O2 -o libipt_ref libipt_ref.c -lipt   (Debian: libipt-dev)
 */
#include <intel-pt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint8_t *read_file(const char *path, size_t *size) {
	FILE *f = fopen(path, "rb");
	if (!f) return NULL;
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *buf = malloc((size_t)len);
	if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) { free(buf); buf = NULL; }
	fclose(f);
	*size = (size_t)len;
	return buf;
}

static void packets(struct pt_config *config) {
	struct pt_packet_decoder *dec = pt_pkt_alloc_decoder(config);
	uint64_t count = 0, errors = 0;
	double start = now();
	for (;;) {
		int status = pt_pkt_sync_forward(dec);
		if (status < 0) break;
		for (;;) {
			struct pt_packet packet;
			status = pt_pkt_next(dec, &packet, sizeof(packet));
			if (status < 0) break;
			count++;
		}
		if (status == -pte_eos) break;
		errors++;
	}
	double secs = now() - start;
	printf("pass=packets packets=%" PRIu64 " errors=%" PRIu64 " secs=%.6f\n", count, errors, secs);
	pt_pkt_free_decoder(dec);
}

static void blocks(struct pt_config *config, struct pt_image *image) {
	struct pt_block_decoder *dec = pt_blk_alloc_decoder(config);
	pt_blk_set_image(dec, image);
	uint64_t insns = 0, nblocks = 0, events = 0, errors = 0;
	double start = now();
	for (;;) {
		int status = pt_blk_sync_forward(dec);
		if (status < 0) break;
		for (;;) {
			while (status & pts_event_pending) {
				struct pt_event event;
				status = pt_blk_event(dec, &event, sizeof(event));
				if (status < 0) break;
				events++;
			}
			if (status < 0) break;
			struct pt_block block;
			status = pt_blk_next(dec, &block, sizeof(block));
			insns += block.ninsn;
			nblocks++;
			if (status < 0) break;
		}
		if (status == -pte_eos) break;
		errors++;
	}
	double secs = now() - start;
	printf("pass=blocks insns=%" PRIu64 " blocks=%" PRIu64 " events=%" PRIu64
	       " errors=%" PRIu64 " secs=%.6f\n", insns, nblocks, events, errors, secs);
	pt_blk_free_decoder(dec);
}

int main(int argc, char **argv) {
	if (argc < 3) {
		fprintf(stderr, "usage: %s TRACE FILE:OFFSET:SIZE:ADDR...\n", argv[0]);
		return 2;
	}
	size_t size;
	uint8_t *trace = read_file(argv[1], &size);
	if (!trace) { perror(argv[1]); return 1; }
	struct pt_image *image = pt_image_alloc("code");
	/* As ptxed: sections through an image section cache, which keeps them mapped (an
	 * image of plain file sections maps and unmaps one at every lookup). */
	struct pt_image_section_cache *iscache = pt_iscache_alloc("iscache");
	pt_iscache_set_limit(iscache, UINT64_MAX);
	for (int i = 2; i < argc; i++) {
		/* FILE may hold ':'; the last three fields are numbers. */
		char *spec = argv[i];
		char *c3 = strrchr(spec, ':');
		if (!c3) { fprintf(stderr, "%s: expected FILE:OFFSET:SIZE:ADDR\n", spec); return 2; }
		*c3 = 0;
		char *c2 = strrchr(spec, ':');
		if (!c2) { fprintf(stderr, "%s: expected FILE:OFFSET:SIZE:ADDR\n", spec); return 2; }
		*c2 = 0;
		char *c1 = strrchr(spec, ':');
		if (!c1) { fprintf(stderr, "%s: expected FILE:OFFSET:SIZE:ADDR\n", spec); return 2; }
		*c1 = 0;
		uint64_t offset = strtoull(c1 + 1, NULL, 0);
		uint64_t len = strtoull(c2 + 1, NULL, 0);
		uint64_t addr = strtoull(c3 + 1, NULL, 0);
		int isid = pt_iscache_add_file(iscache, spec, offset, len ? len : UINT64_MAX, addr);
		if (isid < 0 || pt_image_add_cached(image, iscache, isid, NULL) < 0) {
			fprintf(stderr, "%s: cannot add to the image\n", spec);
			return 1;
		}
	}
	struct pt_config config;
	pt_config_init(&config);
	config.begin = trace;
	config.end = trace + size;
	packets(&config);
	blocks(&config, image);
	pt_image_free(image);
	pt_iscache_free(iscache);
	free(trace);
	return 0;
}
