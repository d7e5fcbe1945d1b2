import io

from tokenmix.io.progress import LOG_INTERVAL_S, progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_update_live_on_a_terminal_and_rarely_in_a_log_file():
    assert progress_bar(range(3), file=_Terminal()).mininterval < 1
    logged = progress_bar(range(3), file=io.StringIO())
    assert logged.mininterval == LOG_INTERVAL_S >= 10
