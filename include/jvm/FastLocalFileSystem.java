package lambdalake.hadoop;

import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.attribute.PosixFileAttributes;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system without a process per call.
 *
 * Without Hadoop's native library (pyspark ships none), RawLocalFileSystem runs `chmod` for
 * every file and folder it creates and `readlink`/`ls` to stat one: thousands of fork+exec of
 * the JVM per minute of streaming (a sixth of the stream's JVM CPU measured here). This class
 * does the same through java.nio ({@link Raw}), with the same results. Set as fs.file.impl: a
 * LocalFileSystem (callers such as FileSystem.getLocal cast to it) that writes no .crc files
 * (Parquet and Spark's checkpoint files carry their own checks); and, through {@link Fs}, as
 * fs.AbstractFileSystem.file.impl (Spark's streaming checkpoints use FileContext).
 */
public class FastLocalFileSystem extends LocalFileSystem {
    public FastLocalFileSystem() {
        super(new Raw());
    }

    @Override
    public void initialize(URI name, Configuration conf) throws IOException {
        super.initialize(name, conf);
        setWriteChecksum(false);
    }

    private static final PosixFilePermission[] BITS = {
        PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
        PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
        PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
    };

    /** The same file system behind Hadoop's FileContext API. */
    public static class Fs extends DelegateToFileSystem {
        public Fs(URI uri, Configuration conf) throws IOException, URISyntaxException {
            super(uri, new Raw(), conf, "file", false);
        }

        @Override
        public int getUriDefaultPort() {
            return -1;
        }

        @Override
        public boolean isValidName(String src) {
            return true;  // any local path, as Hadoop's RawLocalFs
        }
    }

    /** RawLocalFileSystem with java.nio in place of forked chmod/readlink/ls. */
    public static class Raw extends RawLocalFileSystem {
        @Override
        public void setPermission(Path p, FsPermission permission) throws IOException {
            Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
            short mode = permission.toShort();
            for (int bit = 0; bit < BITS.length; bit++) {
                if ((mode & (1 << bit)) != 0) {
                    set.add(BITS[bit]);
                }
            }
            try {
                Files.setPosixFilePermissions(pathToFile(p).toPath(), set);
            } catch (NoSuchFileException e) {
                throw new FileNotFoundException(p.toString());
            }
        }

        @Override
        public FileStatus getFileStatus(Path f) throws IOException {
            return status(f, true);
        }

        @Override
        public FileStatus getFileLinkStatus(Path f) throws IOException {
            return status(f, false);
        }

        @Override
        public FileStatus[] listStatus(Path f) throws IOException {
            File local = pathToFile(f);
            if (!local.exists()) {
                throw new FileNotFoundException("File " + f + " does not exist");
            }
            if (!local.isDirectory()) {
                return new FileStatus[] {status(f, true)};
            }
            String[] names = local.list();
            if (names == null) {
                throw new IOException("cannot list " + f);
            }
            FileStatus[] result = new FileStatus[names.length];
            int found = 0;
            for (String name : names) {
                try {
                    result[found] = status(new Path(f, name), true);
                    found++;
                } catch (FileNotFoundException e) {
                    // removed while listing, as RawLocalFileSystem does
                }
            }
            return found == names.length ? result : java.util.Arrays.copyOf(result, found);
        }

        private FileStatus status(Path f, boolean follow) throws IOException {
            java.nio.file.Path local = pathToFile(f).toPath();
            PosixFileAttributes attributes;
            try {
                attributes = follow
                    ? Files.readAttributes(local, PosixFileAttributes.class)
                    : Files.readAttributes(local, PosixFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
            } catch (NoSuchFileException e) {
                throw new FileNotFoundException("File " + f + " does not exist");
            }
            short mode = 0;
            for (int bit = 0; bit < BITS.length; bit++) {
                if (attributes.permissions().contains(BITS[bit])) {
                    mode |= (short) (1 << bit);
                }
            }
            Path symlink = attributes.isSymbolicLink() ? new Path(Files.readSymbolicLink(local).toString()) : null;
            return new FileStatus(
                attributes.size(), attributes.isDirectory(), 1, getDefaultBlockSize(f),
                attributes.lastModifiedTime().toMillis(), attributes.lastAccessTime().toMillis(), new FsPermission(mode),
                attributes.owner().getName(), attributes.group().getName(), symlink, f.makeQualified(getUri(), getWorkingDirectory()));
        }
    }
}
