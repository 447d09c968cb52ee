"""The foundation every layer uses: errors and exit codes, file writes and the reports
folder's manifest, the cache folder, the process boundary's messages, the hermetic
environment of the test process. Imports nothing else of the package.
"""
