package backlogdagster.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Paths;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * A streaming query's checkpoint files (its offset and commit logs) written on a local
 * disk without starting a process for each.
 *
 * <p>Without Hadoop's native library, Hadoop's local file system sets a new file's
 * permissions by running {@code chmod}, also when it was given none (it takes the default,
 * 0666 less the umask, which a new file has anyway), and its checksummed flavour does so
 * twice, for the file and its {@code .crc}. Spark's file-system checkpoint manager writes
 * each log entry as a new temporary file, then renames it: four processes a micro-batch,
 * which the query's thread waits for (about 35 ms a micro-batch on a busy machine). This
 * manager is Spark's, except that on a local disk it opens that temporary file with Java's
 * own file API: the file gets the same permissions, and the rename into place stays
 * Spark's. Elsewhere (HDFS, object stores) it is Spark's manager unchanged.
 */
public final class LocalCheckpointFiles extends FileSystemBasedCheckpointFileManager {
    private final boolean local;

    public LocalCheckpointFiles(Path path, Configuration conf) {
        super(path, conf);
        local = fs() instanceof LocalFileSystem || fs() instanceof RawLocalFileSystem;
    }

    @Override
    public FSDataOutputStream createTempFile(Path path) {
        if (!local) {
            return super.createTempFile(path);
        }
        java.nio.file.Path file = Paths.get(fs().makeQualified(path).toUri());
        try {
            Files.createDirectories(file.getParent());
            return new FSDataOutputStream(Files.newOutputStream(file), null);
        } catch (IOException error) {
            throw new UncheckedIOException(error);
        }
    }
}
