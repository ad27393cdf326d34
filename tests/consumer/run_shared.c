/* Calls the C consumer built as a shared library (main.c, its main renamed zf_consumer_run). */
int zf_consumer_run(void);

int main(void) { return zf_consumer_run(); }
